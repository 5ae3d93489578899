"""One numbered case of ``unwind fuzz``: its seed and family drawn from the campaign's seed and the
case's index, the input mutated, then opened and replayed under every check (:class:`Fuzzer`)."""

from __future__ import annotations

import json
import lzma
import os
import random
import struct
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from unwind.core import registry
from unwind.formats.dump import Dump, DumpError
from unwind.formats.image import Image, ImageError, find_image, open_image
from unwind.kernel.btf import Btf, BtfError
from unwind.session.replay import ReplayError, Session

from .checks import Outcome, guarded, instrument, one_line, query_btf, read_vmcore, replay_all
from .mutators import apply_edits, mutate_btf, mutate_container, mutate_elf, mutate_image, mutate_json, mutate_regs, \
    mutate_stack, mutate_vmcore, mutate_vmcoreinfo, mutate_vmmem, xz_wrapped
from .seeds import Seed, VmmemSeed, btf_seed, unpacked

FAMILIES = ("stack", "regs", "json", "vmcoreinfo", "elf", "orc", "btf", "vmcore", "image", "vmmem", "container")
#: the share of cases in the ``image`` family (a case parses a whole image: ~100x a dump case)
IMAGE_SHARE = 0.003
#: the share of cases in the ``vmmem`` family (a case loads a whole vmcore slice: ~50 dump cases)
VMMEM_SHARE = 0.004
#: the share of cases in the ``container`` family (a seed compressed, its stream damaged, opened from a file)
CONTAINER_SHARE = 0.01
#: the share of ``vmcore`` cases whose file is then xz-compressed as a whole (read through ``XzSource``)
VMCORE_XZ_SHARE = 0.2
#: CPU seconds one case may take (every task, every mode); over it the case is a hang
CASE_CPU_LIMIT = 5.0
#: CPU seconds a ``vmmem`` case may take: a clean seed's load, listing and replays take 0.4-0.9 s
VMMEM_CPU_LIMIT = 4.0


#: what a regression folder's ``campaign.json`` holds
CAMPAIGN_ABOUT = ("Cases a campaign failed whose input is not a file (the mutator itself raised, or an image case): "
                  "replayed by number with Fuzzer.case(index, campaign, seed_name=seed). expect: the case ends ok "
                  "or rejected.")


_S = TypeVar("_S", Seed, VmmemSeed)


def _drawn_apart(family: str, seed_value: int, index: int, seeds: Sequence[_S], seed_name: str | None
                 ) -> tuple[random.Random, _S]:
    """A case of a family drawn apart (``vmmem``, ``container``): its random numbers, past the draw that chose the
    family, and its seed, drawn from ``seeds`` (the one named ``seed_name``, if given)."""
    rng = random.Random(f"{seed_value}:{index}:{family}")
    rng.random()  # the draw that chose the family
    seed = seeds[rng.randrange(len(seeds))]
    if seed_name is not None:
        seed = next(s for s in seeds if s.name == seed_name)
    return rng, seed


class Fuzzer:
    """Seeds, their images opened once, and the checks of one case."""

    def __init__(self, seeds: list[Seed], cpu_limit: float = CASE_CPU_LIMIT,
                 vmcore_seeds: list[tuple[str, bytes]] | None = None, scratch: Path | None = None,
                 btf_blobs: list[bytes] | None = None, vmmem_seeds: list[VmmemSeed] | None = None) -> None:
        self.seeds = seeds
        self.cpu_limit = cpu_limit
        self.images: dict[Path, Image] = {}
        blobs = list(btf_blobs or [])
        for s in seeds:
            if s.image_path is not None and s.image_path not in self.images:
                sec = self.image(s.image_path).section(".BTF")  # type: ignore[union-attr]
                if sec is not None:
                    blobs.append(sec[1])
        #: BTF seeds: cut from the images' and the given blobs
        self.btf_seeds = [b for b in map(btf_seed, blobs) if b is not None]
        self.vmcore_seeds = vmcore_seeds or []
        #: where a vmcore case's file is written (a tmpfs is best)
        self.scratch = scratch or Path("/dev/shm" if Path("/dev/shm").is_dir() else "/tmp")
        #: the bytes of the last case (to keep a failing case as a regression)
        self.last = b""
        #: where failing cases are written (:meth:`keep_case`), if anywhere
        self.keep: Path | None = None
        #: the regression folder failing cases are added to (:meth:`save_regression`), if any
        self.regressions: Path | None = None
        self._image_bytes: dict[Path, bytes] = {}
        #: the share of cases in the ``image`` family
        self.image_share = IMAGE_SHARE
        #: the vmcore slices the ``vmmem`` family mutates, the share of cases it gets (0: a campaign's
        #: cases as they ran before the family existed) and its CPU bound
        self.vmmem_seeds = vmmem_seeds or []
        self.vmmem_share = VMMEM_SHARE
        self.vmmem_cpu_limit = VMMEM_CPU_LIMIT
        #: the share of cases in the ``container`` family (0: a campaign's cases as they ran before it existed)
        self.container_share = CONTAINER_SHARE

    def families(self, seed: Seed) -> tuple[str, ...]:
        """The families that apply to ``seed``: ``orc`` where its arch mutates its image, ``btf``
        and ``vmcore`` when there are such seeds."""
        backend = registry.get(seed.arch)
        out = list(FAMILIES[:5])  # "image" is chosen apart (IMAGE_SHARE)
        if seed.image_path is not None and type(backend).fuzz_image is not registry.ArchBackend.fuzz_image:
            out.append("orc")
        if self.btf_seeds:
            out.append("btf")
        if self.vmcore_seeds:
            out.append("vmcore")
        return tuple(out)

    def case(self, index: int, seed_value: int, family: str | None = None, seed_name: str | None = None) -> Outcome:
        """Run case ``index`` of the campaign seeded ``seed_value`` (on the seed named ``seed_name``
        if given: the case as it ran on a corpus whose seeds were numbered otherwise).

        A ``vmmem`` or ``container`` case is chosen by a draw of its own (``"{seed_value}:{index}:vmmem"``,
        then ``":container"``), so the other cases are drawn as they were before those families existed."""
        if family == "vmmem" or (family is None and self.vmmem_seeds and self.vmmem_share
                                 and random.Random(f"{seed_value}:{index}:vmmem").random() < self.vmmem_share):
            return self._vmmem(index, seed_value, seed_name)
        if family == "container" or (family is None and self.container_share and random.Random(
                f"{seed_value}:{index}:container").random() < self.container_share):
            return self._container(index, seed_value, seed_name)
        rng = random.Random(f"{seed_value}:{index}")
        seed = self.seeds[rng.randrange(len(self.seeds))]
        if seed_name is not None:
            seed = next(s for s in self.seeds if s.name == seed_name)
        if family is None and seed.image_path is not None and rng.random() < self.image_share:
            family = "image"
        fam = family or rng.choice(self.families(seed))
        out = self.guarded(fam, f"{seed.name} case {seed_value}:{index}", lambda: self._run(rng, seed, fam))
        self._failed(out, seed, f"{fam}-{seed_value}-{index}", f"{seed_value}:{index}")
        return out

    def _failed(self, out: Outcome, seed: Seed | VmmemSeed, name: str, case: str) -> None:
        """Write a failing case where ``--keep`` and ``--save-regressions`` ask."""
        if out.kind in ("ok", "rejected"):
            return
        if self.keep is not None:
            self.keep_case(out, seed, name)
        if self.regressions is not None:
            self.save_regression(out, seed, name, case)

    def _vmmem(self, index: int, seed_value: int, seed_name: str | None) -> Outcome:
        """Case ``index`` as a ``vmmem`` case: a vmcore slice with 1..8 words it read changed."""
        rng, seed = _drawn_apart("vmmem", seed_value, index, self.vmmem_seeds, seed_name)
        seed.recorded(self.scratch)  # once per seed, outside the case's CPU bound
        label = f"{seed.name} case {seed_value}:{index}"
        self.last = b""
        out = self.guarded("vmmem", label, lambda: self._vmmem_case(rng, seed), self.vmmem_cpu_limit)
        self._failed(out, seed, f"vmmem-{seed_value}-{index}", f"{seed_value}:{index}")
        return out

    def _container(self, index: int, seed_value: int, seed_name: str | None) -> Outcome:
        """Case ``index`` as a ``container`` case: a seed compressed, its stream damaged (:func:`mutate_container`)."""
        rng, seed = _drawn_apart("container", seed_value, index, self.seeds, seed_name)
        self.last = b""

        def run() -> Outcome:
            self.last = mutate_container(rng, seed)
            return self.check_container(self.last, seed)
        out = self.guarded("container", f"{seed.name} case {seed_value}:{index}", run)
        self._failed(out, seed, f"container-{seed_value}-{index}", f"{seed_value}:{index}")
        return out

    def check_container(self, data: bytes, seed: Seed) -> Outcome:
        """``data`` as a compressed dump file: the folder search's look at it (``triage``), ``Dump.open``,
        then, where it opens, every task replayed in every mode, with every check."""
        from unwind.cli.triage import looks_like_dump

        # named as its kind's file is (the folder search reads more of a .xz or .gz), by the magic's first byte
        suffix = ".xz" if data[:1] == b"\xfd" else ".gz"
        path = self.scratch / f"unwind-fuzz-{id(self)}-container{suffix}"
        path.write_bytes(data)
        try:
            looks_like_dump(path)
            try:
                dump = Dump.open(path)
            except DumpError as e:
                return one_line("container", e)
        finally:
            path.unlink(missing_ok=True)
        return self.check_dump(dump, seed.name, seed.image_path, "container")

    def _vmmem_case(self, rng: random.Random, seed: VmmemSeed) -> Outcome:
        edits = mutate_vmmem(rng, seed)
        self.last = json.dumps({"seed": seed.name, "edits": edits}).encode()  # kept: the edits, not 10 MB
        return self.check_vmcore(apply_edits(seed.raw, edits), seed)

    def check_vmcore(self, data: bytes | bytearray, seed: VmmemSeed, fam: str = "vmmem") -> Outcome:
        """Load ``data`` as the vmcore ``Session.load(VMCORE, vmlinux=IMAGE)`` opens, list its tasks
        (``ps``), convert them, and replay every task in every mode, with every check."""
        from unwind.cli.tasks import convert, ps_lines

        path = self.scratch / f"unwind-fuzz-{id(self)}-{Path(seed.name).name}.elf"
        path.write_bytes(data)
        session: Session | None = None
        try:
            try:
                session = Session.load(path, vmlinux=seed.image_path)
                tasks = session.select(every=True)
            except (DumpError, ReplayError, ImageError) as e:
                return one_line(fam, e)
            dump: Any = session.dump
            snapshot = dump.task_memory
            dump.task_memory = lambda task: instrument(snapshot(task))
            ps_lines(session)
            convert(session, tasks).to_bytes()
            bad = replay_all(session, tasks)
        finally:
            if session is not None and getattr(session.dump, "phys", None) is not None:
                session.dump.phys.close()  # type: ignore[attr-defined]
            path.unlink(missing_ok=True)
        if bad is not None:
            return Outcome(fam, bad[0], f"{seed.name}: {bad[1]}", len(tasks))
        return Outcome(fam, "ok", "", len(tasks))

    def keep_case(self, out: Outcome, seed: Seed | VmmemSeed, name: str, folder: Path | None = None) -> Path:
        """Write the case's input (``.bin.xz``) and what went wrong (``.txt``) into ``folder`` (:attr:`keep`)."""
        folder = folder or self.keep
        assert folder is not None
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.bin.xz"
        path.write_bytes(lzma.compress(self.last))
        path.with_suffix("").with_suffix(".txt").write_text(
            f"family: {out.family}\nseed: {seed.name}\nimage: {seed.image_path.name if seed.image_path else ''}\n"
            f"outcome: {out.kind}\n{out.detail}\n")
        return path

    def save_regression(self, out: Outcome, seed: Seed | VmmemSeed, name: str, case: str) -> Path:
        """Add a failing case to :attr:`regressions` as the default suite replays it (tests/fuzz/test_fuzz.py):
        its input as :meth:`keep_case` writes it, or, for a case with no input file (an image case, a mutator
        that raised), its number ``campaign:index`` and seed in the folder's ``campaign.json`` (once)."""
        assert self.regressions is not None
        if self.last:
            return self.keep_case(out, seed, name, self.regressions)
        path = self.regressions / "campaign.json"
        book = json.loads(path.read_text()) if path.exists() else {"about": CAMPAIGN_ABOUT, "cases": []}
        if not any(c["case"] == case and c["seed"] == seed.name for c in book["cases"]):
            first = out.detail.splitlines()[0] if out.detail else ""
            book["cases"].append({"case": case, "seed": seed.name, "family": out.family,
                                  "found": f"{out.kind}: {first}", "fixed": ""})
            self.regressions.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(book, indent=2) + "\n")
        return path

    def guarded(self, fam: str, label: str, run: Callable[[], Outcome], limit: float | None = None) -> Outcome:
        """``run()`` under the CPU bound (``limit``, else :attr:`cpu_limit`), any exception turned into
        the outcome that names it."""
        return guarded(fam, label, run, self.cpu_limit if limit is None else limit)

    def _run(self, rng: random.Random, seed: Seed, fam: str) -> Outcome:
        restore: Callable[[], None] | None = None
        self.last = b""
        if fam == "btf":
            return self._btf_case(rng)
        if fam == "vmcore":
            return self._vmcore_case(rng)
        if fam == "image":
            return self._image_case(rng, seed)
        if fam == "elf":
            data = mutate_elf(rng, seed)
        elif fam == "orc":
            restore = self._mutate_image(rng, seed)
            data = seed.writer().to_bytes()
        else:
            data = {"stack": mutate_stack, "regs": mutate_regs, "json": mutate_json,
                    "vmcoreinfo": mutate_vmcoreinfo}[fam](rng, seed).to_bytes()
        self.last = data
        try:
            return self.check(data, seed.name, seed.image_path, fam)
        finally:
            if restore is not None:
                restore()

    def check(self, data: bytes, name: str, image_path: Path | None, fam: str = "") -> Outcome:
        """Open ``data`` as a dump and replay every task in every mode, with every check.

        Exceptions other than a one-line input error propagate (:meth:`case` counts them).
        """
        try:
            dump = Dump(data, name)
        except DumpError as e:
            return one_line(fam, e)
        return self.check_dump(dump, name, image_path, fam)

    def check_dump(self, dump: Dump, name: str, image_path: Path | None, fam: str = "") -> Outcome:
        """Replay every task of ``dump`` (opened) in every mode, with every check (:meth:`check`)."""
        dump.memory = instrument(dump.memory)
        image = self.image(image_path)
        if image is not None and dump.build_id != image.build_id:
            image = None
        session = Session(dump, image, image.symbols if image is not None else None)
        try:
            tasks = session.select(every=True)
        except (DumpError, ReplayError) as e:
            return one_line(fam, e)
        bad = replay_all(session, tasks)
        if bad is not None:
            return Outcome(fam, bad[0], f"{name}: {bad[1]}", len(tasks))
        return Outcome(fam, "ok", "", len(tasks))

    def _btf_case(self, rng: random.Random) -> Outcome:
        bseed = rng.choice(self.btf_seeds)
        self.last = mutate_btf(rng, bseed)
        try:
            btf = Btf(self.last)
        except BtfError as e:
            return one_line("btf", e)
        query_btf(rng, btf, bseed)
        return Outcome("btf", "ok")

    def _vmcore_case(self, rng: random.Random) -> Outcome:
        name, data = rng.choice(self.vmcore_seeds)
        self.last = mutate_vmcore(rng, data)
        if rng.random() < VMCORE_XZ_SHARE:  # drawn after the mutation: the mutation is the case's as before
            self.last = xz_wrapped(rng, self.last)
        path = self.scratch / f"unwind-fuzz-{id(self)}-{name}"
        path.write_bytes(self.last)
        try:
            error = read_vmcore(path)
        finally:
            path.unlink(missing_ok=True)
        return Outcome("vmcore", "ok") if error is None else one_line("vmcore", error)

    def _image_case(self, rng: random.Random, seed: Seed) -> Outcome:
        assert seed.image_path is not None
        raw = self._image_bytes.get(seed.image_path)
        if raw is None:
            raw = self._image_bytes[seed.image_path] = unpacked(seed.image_path)
        mutated = mutate_image(rng, raw)
        self.last = b""  # the image is too big to keep: the case is reproduced by its seed and index
        path = self.scratch / f"unwind-fuzz-{id(self)}-vmlinux"
        path.write_bytes(mutated)
        try:
            return self._check_image(path, seed)
        finally:
            path.unlink(missing_ok=True)

    def _check_image(self, path: Path, seed: Seed) -> Outcome:
        """Open the image as ``--vmlinux`` does (no symbol cache) and replay the seed with it."""
        from unwind.formats.cachefile import CACHE_ENV
        from unwind.kernel.symbols import SymbolError

        saved = os.environ.get(CACHE_ENV)
        os.environ[CACHE_ENV] = "/dev/null/no-cache"  # no cache entry is read or written
        image: Image | None = None
        try:
            dump = Dump(seed.writer().to_bytes(), seed.name)
            dump.memory = instrument(dump.memory)
            open_image.cache_clear()  # the scratch path holds another image each case
            try:
                image = find_image(dump.build_id, None, explicit=path)  # as --vmlinux: build-id checked
                assert image is not None
                symbols = image.symbols
                image.build_id, image.btf, image.release  # noqa: B018 -- read, not kept
                image.text(symbols.address("_stext") or 0, 64) if symbols.address("_stext") else None
            except (ImageError, SymbolError) as e:
                return one_line("image", e)
            session = Session(dump, image, symbols)
            bad = replay_all(session, session.select(every=True))
        finally:
            if image is not None:
                image.close()
            open_image.cache_clear()
            if saved is None:
                os.environ.pop(CACHE_ENV, None)
            else:
                os.environ[CACHE_ENV] = saved
        if bad is not None:
            return Outcome("image", bad[0], f"{seed.name}: {bad[1]}")
        return Outcome("image", "ok")

    def _mutate_image(self, rng: random.Random, seed: Seed) -> Callable[[], None] | None:
        """The arch's image family (``ArchBackend.fuzz_image``) on the seed's image."""
        image = self.image(seed.image_path)
        if image is None:
            return None
        words = [struct.unpack_from("<Q", seed.segments[i][1], off)[0] for i, off in seed.stack_words[:4096]]
        return registry.get(seed.arch).fuzz_image(rng, image, seed.meta.get("kernel", {}).get("release"), words)

    def image(self, path: Path | None) -> Image | None:
        """The image at ``path``, opened (and its symbols decoded) once."""
        if path is None:
            return None
        if path not in self.images:
            self.images[path] = Image(path)
            self.images[path].symbols  # noqa: B018 -- decoded once, before any case
        return self.images[path]
