"""`hillside serve` for the Python tests: started on a free port, its address read from its banner."""

import subprocess
import sys


def start(binary, *flags):
    """The server process and its base URL (`http://127.0.0.1:PORT`, without `/v1`)."""
    server = subprocess.Popen([binary, "serve", "--port", "0", *flags], stdout=subprocess.PIPE, text=True)
    banner = server.stdout.readline()
    if "http://" not in banner:
        server.kill()
        sys.exit(f"no address in the server's banner: {banner!r}")
    return server, "http://" + banner.split("http://")[1].split()[0].removesuffix("/v1")
