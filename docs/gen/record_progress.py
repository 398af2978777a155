"""Record a real batch's progress bar and write it as an SVG for the docs.

    python docs/gen/record_progress.py [--out docs/assets/batch-progress.svg]

Runs :data:`SCRIPT` (a 300-input batch on the local backend, under a temporary
``KINETIC_LOCAL_ROOT``) with its stderr on a pseudo-terminal, so Kinetic draws its live
progress bar exactly as it does for a user; reads every frame the bar painted, picks one
from the middle of the run, and renders it with rich's SVG export. Nothing is drawn by
hand: re-run this after a change to the progress display and check the picture in.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import tempfile
import termios
import textwrap
from pathlib import Path

COLUMNS = 100
SCRIPT = textwrap.dedent(
    """
    import time
    import kinetic

    @kinetic.run()
    def score(x):
        time.sleep(0.02)
        return x * x

    batch = score.run_async_map(range(300), max_concurrent=4, name="scores")
    values = batch.results()            # blocks; draws the progress bar on a terminal
    print("sum:", sum(values))
    """
)
# rich repaints a live display after a carriage return and "erase line"; cursor moves and
# visibility toggles carry no text.
_REPAINT = re.compile(r"\r|\x1b\[2K|\x1b\[\d*[AB]|\x1b\[\?25[lh]")


def record(workdir: Path) -> tuple[list[str], str]:
    """Run the batch on a pseudo-terminal; return the painted frames and stdout."""
    (workdir / "fanout.py").write_text(SCRIPT, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KINETIC_", "GOOGLE_"))}
    env |= {
        "KINETIC_LOCAL_ROOT": str(workdir / "root"),
        "KINETIC_CACHE_DIR": str(workdir / "cache"),
        "KINETIC_PROFILES_FILE": str(workdir / "profiles.json"),
        "KINETIC_QUIET": "1",
        "KINETIC_LOCAL_LAUNCHER_IDLE": "5",
        "TERM": "xterm-256color",
        "COLUMNS": str(COLUMNS),
    }
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, COLUMNS, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "fanout.py"],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=follower,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.stdout is not None
    stdout = proc.stdout.read().decode()
    proc.stdout.close()
    if proc.wait(timeout=300) != 0:
        raise SystemExit(f"the batch failed:\n{b''.join(chunks).decode(errors='replace')}")
    painted = b"".join(chunks).decode(errors="replace")
    frames = [f for f in _REPAINT.split(painted) if "grp-" in f]
    return frames, stdout


def pick(frames: list[str]) -> str:
    """A frame from the middle of the run: some inputs done, some running, some queued."""
    done = re.compile(r"done (\d+)\s+failed (\d+)\s+running (\d+)\s+queued (\d+)")

    def counts(frame: str) -> tuple[int, ...]:
        m = done.search(re.sub(r"\x1b\[[0-9;]*m", "", frame))
        return tuple(int(g) for g in m.groups()) if m else (0, 0, 0, 0)

    middle = [f for f in frames if counts(f)[0] > 0 and counts(f)[3] > 0]
    if not middle:
        raise SystemExit(f"no frame from the middle of the run among {len(frames)} frames")
    return middle[len(middle) // 2]


def render(frame: str) -> str:
    from rich.console import Console
    from rich.text import Text

    with open(os.devnull, "w") as sink:
        console = Console(
            record=True, width=COLUMNS, force_terminal=True, color_system="truecolor", file=sink
        )
        console.print(Text("$ python fanout.py", style="bold"))
        console.print(Text.from_ansi(frame))
        return console.export_svg(title="a 300-input batch on the local backend")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = Path(__file__).resolve().parent.parent
    parser.add_argument("--out", type=Path, default=here / "assets" / "batch-progress.svg")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kinetic-progress-") as tmp:
        frames, stdout = record(Path(tmp))
    if "sum: 8955050" not in stdout:
        raise SystemExit(f"unexpected output: {stdout!r}")
    args.out.write_text(render(pick(frames)), encoding="utf-8")
    print(f"{len(frames)} frames painted; wrote {args.out}")


if __name__ == "__main__":
    main()
