"""The cache of validated notes (``unwind.formats.note.read_note``): a dump file's note validated once is read
back as the same validated note; a missing, damaged or stale entry is validated again, never trusted;
a note with warnings, and a dump given as bytes, leave no entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from unwind.formats import note
from unwind.formats.dump import Dump

from .test_dump import sample
from .test_note import written


def _parts(d: Dump) -> tuple[object, ...]:
    """What a dump's open made of its note."""
    return (d.note, d.meta, d.tasks(), d.cpus, d.warnings)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "notes"


@pytest.fixture
def dump_file(tmp_path: Path) -> Path:
    path = tmp_path / "d.bin"
    path.write_bytes(sample().to_bytes())
    return path


def _validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the calls of the validator from here on."""
    calls: list[int] = []
    validate = note.validate_note

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return validate(*args, **kwargs)

    monkeypatch.setattr(note, "validate_note", counted)
    return calls


def test_a_second_open_reads_the_validated_note_from_the_cache(cache, dump_file, monkeypatch):
    fresh = Dump(dump_file.read_bytes(), str(dump_file))  # bytes: validated, no entry written
    assert not cache.exists() or not list(cache.iterdir())
    first = Dump.open(dump_file)
    assert len(list(cache.glob("*.note"))) == 1
    calls = _validations(monkeypatch)
    second = Dump.open(dump_file)
    assert calls == []
    assert _parts(second) == _parts(first) == _parts(fresh)
    assert second._task_keys == first._task_keys


def test_a_damaged_entry_is_validated_again_and_rewritten(cache, dump_file, monkeypatch):
    first = Dump.open(dump_file)
    (entry,) = cache.glob("*.note")
    good = entry.read_bytes()
    for damaged in (good[:-1] + bytes([good[-1] ^ 1]), good[:40], b"", note._CACHE_MAGIC + bytes(20) + b"x"):
        entry.write_bytes(damaged)
        calls = _validations(monkeypatch)
        again = Dump.open(dump_file)
        assert calls == [1]
        assert _parts(again) == _parts(first)
        assert entry.read_bytes() == good
        monkeypatch.undo()
        monkeypatch.setenv("UNWIND_CACHE", str(cache.parent))


def test_an_entry_under_another_notes_name_is_not_read(cache, dump_file, tmp_path, monkeypatch):
    """An entry copied (or forged without the key) under the name of another note is no answer for it."""
    Dump.open(dump_file)
    (mine,) = cache.glob("*.note")
    other = tmp_path / "other.bin"
    other.write_bytes(written(lambda m: m["tasks"][0].update(comm="another")))
    want = _parts(Dump(other.read_bytes(), str(other)))
    Dump.open(other)
    (theirs,) = set(cache.glob("*.note")) - {mine}
    theirs.write_bytes(mine.read_bytes())
    calls = _validations(monkeypatch)
    assert _parts(Dump.open(other)) == want
    assert calls == [1]


def test_an_entry_of_another_validator_is_not_read(cache, dump_file, monkeypatch):
    Dump.open(dump_file)
    monkeypatch.setattr(note, "_validator_identity", lambda: b"another schema")
    calls = _validations(monkeypatch)
    Dump.open(dump_file)
    assert calls == [1]
    assert len(list(cache.glob("*.note"))) == 2


def test_other_context_keys_are_another_entry(cache):
    sd = sample()
    sd.to_bytes()
    raw = note.note_bytes(sd.writer.meta)
    a = note.read_note(raw, frozenset({"fp", "pc", "sp"}), cached=True)
    b = note.read_note(raw, None, cached=True)
    assert len(list(cache.glob("*.note"))) == 2
    assert note.read_note(raw, None, cached=True) == b == a
    warned: list[str] = []
    c = note.read_note(raw, frozenset({"fp"}), warned.append, cached=True)  # pc dropped: a warning, no entry
    assert warned and c[1]["tasks"][0]["context"] == {"fp": 0x10100} != a[1]["tasks"][0]["context"]
    assert len(list(cache.glob("*.note"))) == 2
    warned.clear()
    assert note.read_note(raw, frozenset({"fp"}), warned.append, cached=True) == c and warned


def test_a_note_with_warnings_is_not_cached(cache, tmp_path):
    path = tmp_path / "w.bin"  # an optional key malformed: dropped with a warning
    path.write_bytes(written(lambda m: m["oracles"].append({"source": "bad", "frames": "not a list"})))
    for _ in range(2):
        d = Dump.open(path)
        assert any("dropped oracles[1]" in w for w in d.warnings)
    assert not list(cache.glob("*.note"))


def test_no_cache_folder_still_opens(dump_file, monkeypatch):
    monkeypatch.setenv("UNWIND_CACHE", "/dev/null/no-cache")
    assert _parts(Dump.open(dump_file)) == _parts(Dump(dump_file.read_bytes(), str(dump_file)))
