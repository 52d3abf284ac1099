"""The ``relay`` command: ``relay serve [--host] [--port]``, ``relay levels review|propose [--json]``,
``relay levels restore <backend> --reason TEXT`` and ``relay quarantined list|retry <worker> <subject>``.

Triggered from the shell. Reads the settings (environment, ``RELAY_CONFIG_FILE``); a bad setting
stops start-up with a message naming it (exit 2). Each subcommand is a function registered with
``@subcommand``, which adds its parser and its handler in one place: a new one is a decorated
function in this module or any module imported here.
"""

from __future__ import annotations

import argparse
import gc
import signal
import sys
from collections.abc import Callable

from conformance.descriptors import DescriptorError

from relay.settings import SettingsError, load_settings

__all__ = ["main", "subcommand"]

Handler = Callable[[argparse.Namespace], int]
_SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Handler]] = {}


def subcommand(name: str, help: str, arguments: Callable[[argparse.ArgumentParser], None] = lambda p: None):
    """Register ``handler(args) -> exit code`` as ``relay <name>``; ``arguments(parser)`` adds its options."""

    def register(handler: Handler) -> Handler:
        _SUBCOMMANDS[name] = (help, arguments, handler)
        return handler

    return register


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")


@subcommand("serve", "run the relay service (webhook intake + dispatcher)", _serve_arguments)
def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from relay.app import create_app
    from relay.logs import configure_logging
    from relay.assembly import parts_of
    from relay.store import StoreUnavailable
    from relay.web.serving import uvicorn_options

    settings = load_settings()
    configure_logging(settings.log_level, settings.log_format)
    app = create_app(settings)
    try:
        parts_of(app).store.ping()
    except StoreUnavailable as exc:
        raise SettingsError(f"RELAY_DATABASE_URL: {exc}") from None
    # Everything loaded so far lives as long as the process: keep it out of the garbage collector's
    # full passes, which otherwise walk those ~140 000 objects and stall every request for ~100 ms.
    gc.collect()
    gc.freeze()
    # SIGHUP reloads the backend descriptors (uvicorn handles only SIGINT and SIGTERM; SIGHUP would end it).
    signal.signal(signal.SIGHUP, lambda _signum, _frame: parts_of(app).descriptors.request())
    # Bounded resources for an exposed listener: connections, keep-alive and a header deadline.
    uvicorn.run(app, host=args.host, port=args.port, log_level=settings.log_level.lower(), access_log=False,
                **uvicorn_options(settings))
    return 0


def _levels_arguments(parser: argparse.ArgumentParser) -> None:
    from relay.levels.command_line import arguments

    arguments(parser)


@subcommand("levels", "level review (each backend against its level criteria, promotion/demotion advice) "
                      "and restore (end a backend's level hold)", _levels_arguments)
def levels(args: argparse.Namespace) -> int:
    from relay.levels.command_line import levels_command

    return levels_command(args)


def _quarantined_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the rows set aside, newest first, with their errors")
    listing.add_argument("--limit", type=int, default=100)
    retry = actions.add_parser("retry", help="let the passes try one row again (after fixing what it raised)")
    retry.add_argument("worker", help="the pass: run_rows, time_outs, re-runs, ...")
    retry.add_argument("subject", help="the row, as listed: 'dispatch 17', 'delivery <id>', ...")


@subcommand("quarantined", "rows background passes set aside: list them, or retry one", _quarantined_arguments)
def quarantined(args: argparse.Namespace) -> int:
    from relay.store import Store

    store = Store(load_settings().database_url)
    try:
        if args.action == "list":
            for entry in store.quarantined(args.limit):
                print(f"{entry.quarantined_at.isoformat()}  {entry.worker}  {entry.subject}  {entry.error}")
            return 0
        if store.release_quarantined(args.worker, args.subject):
            print(f"{args.worker} {args.subject}: released; the next pass tries it again")
            return 0
        print(f"relay quarantined: {args.worker} {args.subject!r} is not set aside", file=sys.stderr)
        return 1
    finally:
        store.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relay", description="CI relay: upstream webhooks in, repository_dispatch out")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, arguments, handler) in _SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        arguments(sub)
        sub.set_defaults(handler=handler)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (SettingsError, DescriptorError, ValueError) as exc:
        print(f"relay {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
