"""The sgdsl command: run entry points, stream, readable errors, help."""
from __future__ import annotations

import textwrap

from sgdsl.cli import backend_spec, main

PROGRAM = textwrap.dedent('''
    import sgdsl
    from sgdsl.testing import ScriptedBackend

    sgdsl.set_default_backend(ScriptedBackend(outputs=["Hello, Ada!"]))

    @sgdsl.entrypoint
    def greet(s, name):
        s += "Greeting for " + name + ": "
        s += sgdsl.gen("greeting")
''')

FAILING = textwrap.dedent('''
    import sgdsl
    from sgdsl.testing import ScriptedBackend

    sgdsl.set_default_backend(ScriptedBackend(fail_with=ConnectionError("server unreachable")))

    @sgdsl.function
    def main(s):
        s += sgdsl.gen("x")
''')


def test_run_streams_an_entrypoint_with_program_args(tmp_path, capsys):
    path = tmp_path / "greet.py"
    path.write_text(PROGRAM)
    assert main(["run", str(path), "--", "name=Ada"]) == 0
    assert capsys.readouterr().out.strip() == "Greeting for Ada: Hello, Ada!"


def test_run_reports_errors_readably_and_exits_nonzero(tmp_path, capsys):
    path = tmp_path / "bad.py"
    path.write_text(FAILING)
    assert main(["run", str(path)]) == 1
    err = capsys.readouterr().err
    assert "error: ConnectionError: server unreachable" in err and "bad.py" in err
    assert main(["run", str(tmp_path / "missing.py")]) == 1


def test_plain_main_gets_the_program_args(tmp_path, capsys):
    path = tmp_path / "plain.py"
    path.write_text("def main(argv):\n    print('args', argv)\n")
    assert main(["run", str(path), "--", "a", "b"]) == 0
    assert "args ['a', 'b']" in capsys.readouterr().out


def test_help_lists_commands(capsys):
    try:
        main(["--help"])
    except SystemExit as exit_:
        assert exit_.code == 0
    out = capsys.readouterr().out
    assert "run" in out and "serve" in out and "@sgdsl.entrypoint" in out


def test_backend_and_model_combine():
    assert backend_spec("openai", "gpt-4o") == "openai:gpt-4o"
    assert backend_spec(None, "/m") == "local:/m"
    assert backend_spec("http://h:1", None) == "http://h:1"


def test_serve_dispatches_to_the_runtime_launcher(monkeypatch):
    import sys
    import types

    seen = []
    fake = types.ModuleType("sgdsl.runtime.launcher.cli")
    fake.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "sgdsl.runtime.launcher.cli", fake)
    assert main(["serve", "--port", "1234"]) == 0
    assert seen == [["--port", "1234"]]
