"""Make a peer pair for ``bench_peer.py``: one stop of a lab guest, as our dump and as QEMU's vmcore.

Usage (a guest booted with ``unwind lab boot --arch ARCH``)::

    python3 benches/peer_pair.py --lab x86_64 -o /tmp/peer/stop

stops the guest through its gdbstub, captures the stop into
``/tmp/peer/stop.bin.xz`` as ``unwind capture`` does, has QEMU write
``/tmp/peer/stop.vmcore`` (HMP ``dump-guest-memory``) while the guest is still
stopped, then lets the guest run again. ``UNWIND_PEER_DUMPS=/tmp/peer`` then
points the peer benches at the pair.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from unwind.lab.boot import lab_state
from unwind.lab.capture import write_qemu_vmcores
from unwind.lab.cli import LAB_ERRORS
from unwind.lab.fetch import canonical_arch
from unwind.lab.guest import CaptureError, CaptureSession, GuestImage, StopResult
from unwind.lab.monitor import Monitor
from unwind.lab.rsp import RspClient


def capture_pair(arch: str, prefix: Path, tries: int = 20) -> tuple[Path, Path]:
    """Stop the lab guest of ``arch`` once and write ``PREFIX.bin.xz`` and ``PREFIX.vmcore`` of that stop."""
    lab = lab_state(canonical_arch(arch))
    img = GuestImage(Path(lab["kernel"]) / "vmlinux")
    host, _, port = lab["gdb"].rpartition(":")
    rsp = RspClient(host or "127.0.0.1", int(port), timeout=30.0)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    dump, vmcore = prefix.with_name(prefix.name + ".bin.xz"), prefix.with_name(prefix.name + ".vmcore")
    try:
        if rsp.running:
            rsp.halt()
        s = CaptureSession(rsp, img)
        s.setup()
        res: StopResult | str = "not tried"
        for _ in range(tries):
            res = s.capture_stop("random")
            if not isinstance(res, str):
                break
            s.log(f"[peer] stop skipped ({res}); retrying")
            rsp.cont()
            time.sleep(0.3)
            rsp.halt()
        if isinstance(res, str):
            raise CaptureError(f"no usable stop in {tries} tries: {res}")
        s.write_dump(res, dump, lab["release"], {"qemu": shlex.join(lab["qemu"]), "peer_vmcore": vmcore.name})
        s.log(f"[peer] wrote {dump}; dumping guest memory to {vmcore}")
        with Monitor(lab["monitor"], timeout=900.0) as mon:
            (elf,) = write_qemu_vmcores(mon, dump, ["elf"], s.log)
        (dump.parent / elf).replace(vmcore)
    finally:
        rsp.release()
    return dump, vmcore


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--lab ARCH -o PREFIX``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lab", required=True, metavar="ARCH", help="the arch of the running lab guest")
    p.add_argument("-o", "--output", required=True, metavar="PREFIX", help="writes PREFIX.bin.xz and PREFIX.vmcore")
    args = p.parse_args(argv)
    try:
        dump, vmcore = capture_pair(args.lab, Path(args.output))
    except LAB_ERRORS as e:
        print(f"peer_pair: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"{dump}\n{vmcore}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
