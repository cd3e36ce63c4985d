"""`python -m pulsar_migration.lookup [--config FILE] [--host H] [--port P]`: runs the lookup service.

Exit 2 with one `error:` line when the configuration or a token variable is missing; SIGTERM/SIGINT stop
it gracefully (in-flight requests finish, parked ones are answered).
"""

from __future__ import annotations

import argparse
import logging
import sys
from types import FrameType

from pulsar_migration.lookup.config import ConfigError, LookupConfig

log = logging.getLogger("pulsar_migration.lookup")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pulsar_migration.lookup", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="JSON config file (default: $PM_LOOKUP_CONFIG)")
    parser.add_argument("--host", help="listen address (default: the config's host)")
    parser.add_argument("--port", type=int, help="listen port (default: the config's port)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = LookupConfig.load(args.config)
        from pulsar_migration.lookup.service import create_app

        app = create_app(config)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    import uvicorn

    from pulsar_migration.lookup.service import answer_parked_soon

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            answer_parked_soon(app)  # before the graceful shutdown's wait for in-flight requests
            super().handle_exit(sig, frame)

    serving = config.tls or {}
    Server(uvicorn.Config(app, host=args.host or config.host, port=args.port or config.port, log_level="warning",
                          timeout_graceful_shutdown=5, access_log=False, ssl_certfile=serving.get("cert_file"),
                          ssl_keyfile=serving.get("key_file"))).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
