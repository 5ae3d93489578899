"""The API reference builds from the docstrings (pdoc, the ``docs`` extra) and documents every export."""

from __future__ import annotations

import html
import inspect
import re

import pytest

import unwind
from unwind.dev.apidoc import build, main


def _first_line(obj: object) -> str:
    return (inspect.getdoc(obj) or "").splitlines()[0]


def test_every_export_and_its_public_members_have_docstrings():
    missing = []
    for name in unwind.__all__:
        obj = getattr(unwind, name)
        doc = obj.__doc__ or ""
        if not doc.strip() or (inspect.isclass(obj) and doc.startswith(f"{name}(")):  # a dataclass's made-up doc
            missing.append(name)
        for attr, value in vars(obj).items() if inspect.isclass(obj) else ():
            func = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            if not attr.startswith("_") and (callable(func) or isinstance(value, property)) and not func.__doc__:
                missing.append(f"{name}.{attr}")
    assert missing == []


def test_the_reference_builds_and_holds_every_export(tmp_path):
    pytest.importorskip("pdoc", reason="needs pdoc (pip install '.[docs]')")
    page = build(tmp_path)
    text = page.read_text()
    assert (tmp_path / "index.html").is_file()
    for name in unwind.__all__:
        assert f'id="{name}"' in text, name
        first = _first_line(getattr(unwind, name))
        words = re.sub(r"``?|:\w+:", "", first).split()[:4]        # reST markup rendered away
        assert html.escape(" ".join(words), quote=False) in re.sub(r"<[^>]+>", "", text), name
    assert 'id="Session.saved_regs"' in text and 'id="Options.complete"' in text


def test_without_pdoc_it_says_so(tmp_path, monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def no_pdoc(name, *args, **kwargs):
        if name.split(".")[0] == "pdoc":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pdoc)
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "unwind: error: the API reference needs pdoc: pip install '.[docs]'"
