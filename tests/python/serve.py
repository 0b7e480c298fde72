"""`hillside serve` for the Python tests: started on a free port, its address read from its banner."""

import subprocess
import sys


def start(binary, *flags, env=None):
    """The server process and its base URL (`http://127.0.0.1:PORT`, without `/v1`)."""
    server = subprocess.Popen([binary, "serve", "--port", "0", *flags], stdout=subprocess.PIPE, text=True, env=env)
    banner = server.stdout.readline()
    if "http://" not in banner:
        server.kill()
        sys.exit(f"no address in the server's banner: {banner!r}")
    return server, "http://" + banner.split("http://")[1].split()[0].removesuffix("/v1")


def control_secret(server):
    """This run's control secret, from the web UI's link (the banner's next line)."""
    line = server.stdout.readline()
    if "#secret=" not in line:
        server.kill()
        sys.exit(f"no control secret in the server's banner: {line!r}")
    return line.split("#secret=")[1].strip()
