"""The ``sgdsl`` command.

  sgdsl run program.py [--backend SPEC] [--model NAME] [--no-stream] [-- ARGS...]
  sgdsl serve [server options]      (the bundled runtime's HTTP server; --dp-size N replicas)
  sgdsl router --worker-urls URL... (a data-parallel router in front of running servers)
  sgdsl templates                   (list the shipped chat templates)

``run`` imports the file and runs its entry points: every program decorated with
``@sgdsl.entrypoint``; if there is none, a module-level ``main``. An entry point that is a
program gets ``ARGS`` as ``key=value`` keyword arguments and its output is streamed to the
terminal; a plain ``main`` function is called with the ``ARGS`` list (if it takes a parameter).
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from typing import Any, Sequence

EPILOG = __doc__.split("\n\n", 1)[1]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":
        from sgdsl.runtime.launcher.cli import main as serve  # noqa: PLC0415

        return serve(argv[1:]) or 0
    if argv and argv[0] == "router":
        from sgdsl.runtime.router.cli import main as route  # noqa: PLC0415

        return route(argv[1:]) or 0
    program_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, program_args = argv[:cut], argv[cut + 1:]
    args = _parser().parse_args(argv)
    if args.command == "templates":
        from sgdsl.chat_template import list_chat_templates  # noqa: PLC0415

        print("\n".join(list_chat_templates()))
        return 0
    if args.command != "run":
        _parser().print_help()
        return 2
    return run_file(Path(args.program), program_args, backend=args.backend, model=args.model,
                    stream=not args.no_stream, verbose=args.traceback)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sgdsl", description="sgdsl: structured generation programs",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="{run,serve,router,templates}")
    run = commands.add_parser("run", help="run a program file's entry points",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("program", help="path to a .py file")
    run.add_argument("--backend", help="local, local:PATH, openai:MODEL, anthropic:MODEL, http://HOST:PORT")
    run.add_argument("--model", help="model for the backend (a path for local, a name for APIs)")
    run.add_argument("--no-stream", action="store_true", help="print the final text instead of streaming")
    run.add_argument("--traceback", action="store_true", help="print full tracebacks on errors")
    commands.add_parser("serve", help="start the runtime's HTTP server (see `sgdsl serve --help`)")
    commands.add_parser("router", help="route between servers (see `sgdsl router --help`)")
    commands.add_parser("templates", help="list the shipped chat templates")
    return parser


def backend_spec(backend: str | None, model: str | None) -> str | None:
    """Combine ``--backend`` and ``--model`` into one spec string."""
    if model is None:
        return backend
    kind = (backend or "local").partition(":")[0]
    return f"{kind}:{model}"


def run_file(path: Path, program_args: list[str], *, backend: str | None = None,
             model: str | None = None, stream: bool = True, verbose: bool = False) -> int:
    try:
        spec = backend_spec(backend, model)
        if spec:
            from sgdsl.config import set_default_backend  # noqa: PLC0415

            set_default_backend(spec)
        module = _load(path)
        entries = entry_points(module)
        if not entries:
            print(f"error: {path} has no @sgdsl.entrypoint program and no main()", file=sys.stderr)
            return 2
        for entry in entries:
            _run_entry(entry, program_args, stream)
        return 0
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI's job is a readable message
        _report(exc, verbose)
        return 1


def _load(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"no such program file: {path}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))
    spec.loader.exec_module(module)
    return module


def entry_points(module: Any) -> list[Any]:
    """The file's ``@entrypoint`` programs (in definition order), else its ``main``."""
    marked = [v for v in vars(module).values() if getattr(v, "__sgdsl_entrypoint__", False)]
    if marked:
        return marked
    main_fn = getattr(module, "main", None)
    return [main_fn] if callable(main_fn) else []


def _run_entry(entry: Any, program_args: list[str], stream: bool) -> None:
    from sgdsl.function import SglFunction  # noqa: PLC0415

    if not isinstance(entry, SglFunction):
        takes_args = bool(inspect.signature(entry).parameters)
        entry(program_args) if takes_args else entry()
        return
    kwargs = parse_program_args(program_args)
    if not stream:
        print(entry.run(**kwargs).text())
        return
    state = entry.run(stream=True, **kwargs)
    for chunk in state.text_iter():
        print(chunk, end="", flush=True)
    print()


def parse_program_args(items: list[str]) -> dict[str, str]:
    kwargs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"program arguments are key=value pairs, got {item!r}")
        kwargs[key.lstrip("-").replace("-", "_")] = value
    return kwargs


def _report(exc: BaseException, verbose: bool) -> None:
    if verbose:
        traceback.print_exception(exc)
        return
    print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
    for note in getattr(exc, "__notes__", []):
        print(note, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
