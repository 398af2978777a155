"""The dashboard's HTML: server-rendered pages, an inline SVG chart, and one small
script that applies server-sent events to the page. Pure: strings in, strings out.

Every link and form carries the token (``t``) of the page it came from; every value
from the records is escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from urllib.parse import quote, urlencode

from kinetic._dashboard.progress import RUNNING, STATE_NAMES, BatchProgress, Sample

REGION = 500
"""Inputs shown per region of a batch's input grid."""

_COLORS = {
    "succeeded": "#2e9d4f",
    "failed": "#d64545",
    "cancelled": "#9a6fb0",
    "running": "#2f7fd1",
    "pending": "#c9ced6",
}
_CELL = {0: "pending", 1: "succeeded", 2: "failed", 3: "cancelled", RUNNING: "running"}

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232b;background:#f6f7f9}
header{background:#1d232b;color:#fff;padding:.6em 1.2em}header a{color:#fff;margin-right:1em}
main{padding:1em 1.2em;max-width:1200px}
table{border-collapse:collapse;background:#fff}td,th{padding:.25em .7em;border-bottom:1px solid #e3e6ea;
text-align:left;vertical-align:top}th{background:#eef0f3}
.st{font-weight:600}.SUCCEEDED,.succeeded{color:#2e9d4f}.FAILED,.failed{color:#d64545}
.RUNNING,.running{color:#2f7fd1}.PENDING,.pending{color:#6b7480}.cancelled{color:#9a6fb0}
pre{background:#11151a;color:#e8eaed;padding:.8em;overflow:auto;max-height:32em;font-size:12px}
.cards{display:flex;gap:1em;flex-wrap:wrap;margin:.5em 0}.card{background:#fff;padding:.5em 1em;
border:1px solid #e3e6ea;border-radius:6px}.card b{display:block;font-size:1.5em}
.grid{display:flex;flex-wrap:wrap;gap:2px;max-width:900px}.grid a{width:14px;height:14px;display:block}
button{padding:.35em .9em}.danger{background:#d64545;color:#fff;border:0;border-radius:4px}
nav.filter a{margin-right:.6em}small{color:#6b7480}
"""

# Applies the server's events: each names elements by id and brings their new HTML
# (rendered by the server), or a chunk of log to append. Nothing else runs in the page.
_SCRIPT = """
(function(){var b=document.body,src=b.dataset.events;if(!src)return;
var es=new EventSource(src);
es.addEventListener('html',function(e){var d=JSON.parse(e.data);for(var k in d){
var el=document.getElementById(k);if(el)el.innerHTML=d[k];}});
es.addEventListener('log',function(e){var el=document.getElementById('log');
var atEnd=el.scrollTop+el.clientHeight>=el.scrollHeight-4;el.textContent+=JSON.parse(e.data);
if(atEnd)el.scrollTop=el.scrollHeight;});
es.addEventListener('end',function(e){es.close();var s=document.getElementById('live');
if(s)s.textContent=JSON.parse(e.data);});})();
"""


def link(path: str, token: str, **query: str | int) -> str:
    """An escaped URL of a dashboard page, with the token."""
    q = urlencode({"t": token, **{k: str(v) for k, v in query.items()}})
    return escape(f"{quote(path)}?{q}")


def page(title: str, body: str, token: str, *, events: str | None = None) -> bytes:
    data = f' data-events="{events}"' if events else ""
    nav = f'<a href="{link("/", token)}">Jobs</a><a href="{link("/batches", token)}">Batches</a>'
    return (
        "<!doctype html><html><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width">'
        f"<title>{escape(title)} · Kinetic</title><style>{_STYLE}</style></head>"
        f"<body{data}><header><b>Kinetic</b> &nbsp; {nav}</header><main>{body}</main>"
        f"<script>{_SCRIPT}</script></body></html>"
    ).encode()


def human_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, ident: str = "") -> str:
    """A table; cells are HTML already (escape values before)."""
    attr = f' id="{ident}"' if ident else ""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def chart(samples: Sequence[Sample], total: int, width: int = 720, height: int = 180) -> str:
    """Stacked areas (done, failed, running, pending) over the samples' time span."""
    if not samples or total <= 0:
        return f'<svg id="chart-svg" width="{width}" height="{height}"></svg>'
    t0, t1 = samples[0].t, samples[-1].t
    span = max(t1 - t0, 1e-9)
    pts = list(samples) if len(samples) > 1 else [samples[0], samples[0]._replace(t=t0 + 1)]
    if len(samples) == 1:
        span = 1.0

    def x(t: float) -> float:
        return round((t - t0) / span * width, 1)

    def y(v: float) -> float:
        return round(height - v / total * height, 1)

    layers = (("succeeded", 1), ("failed", 2), ("running", 3), ("pending", 4))
    below = [0.0] * len(pts)
    shapes: list[str] = []
    for name, column in layers:
        above = [b + s[column] for b, s in zip(below, pts, strict=True)]
        top = " ".join(f"{x(s.t)},{y(a)}" for s, a in zip(pts, above, strict=True))
        bottom = " ".join(
            f"{x(s.t)},{y(b)}" for s, b in zip(reversed(pts), reversed(below), strict=True)
        )
        shapes.append(
            f'<polygon class="area-{name}" fill="{_COLORS[name]}" points="{top} {bottom}"/>'
        )
        below = above
    label = f"last {human_seconds(t1 - t0)} seen" if len(samples) > 1 else "one look so far"
    return (
        f'<svg id="chart-svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}"'
        f' role="img" aria-label="progress over time">{"".join(shapes)}</svg>'
        f"<br><small>{escape(label)}</small>"
    )


def batch_summary(p: BatchProgress, rate: float) -> str:
    done, total = p.succeeded + p.failed, p.total
    percent = 100.0 * done / total if total else 100.0
    cards = [
        ("progress", f'<span id="percent">{percent:.1f}%</span>'),
        ("succeeded", str(p.succeeded)),
        ("failed", f'<span id="failed-count">{p.failed}</span>'),
        ("running", str(len(p.running))),
        ("pending", str(p.pending)),
        ("inputs/s", f"{rate:.1f}"),
        ("inputs", str(total)),
    ]
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><small>{k}</small><b class="{k}">{v}</b></div>' for k, v in cards
        )
        + "</div>"
    )


def failures(p: BatchProgress, group_id: str, token: str) -> str:
    if not p.groups:
        return "<p><small>No input failed.</small></p>"
    parts: list[str] = []
    for g in sorted(p.groups.values(), key=lambda g: -g.count):
        shown = ", ".join(
            f'<a href="{link(f"/batches/{group_id}/inputs/{i}", token)}">{i}</a>' for i in g.indices
        )
        more = f" … and {g.count - len(g.indices)} more" if g.count > len(g.indices) else ""
        tb = f"<pre>{escape(g.traceback)}</pre>" if g.traceback else ""
        parts.append(
            f'<div class="group" data-key="{escape(g.key)}"><h3><span class="failed">'
            f'{escape(g.key)}</span> × <span class="group-count">{g.count}</span></h3>'
            f"<p>{escape(g.message)}</p><p><small>inputs:</small> {shown}{more}</p>"
            f"<details><summary>example traceback (input {g.example})</summary>{tb}</details>"
            "</div>"
        )
    return "".join(parts)


def slowest(rows: Sequence[tuple[int, float, bool]], group_id: str, token: str) -> str:
    if not rows:
        return "<p><small>Nothing timed yet (durations are those the dashboard saw).</small></p>"
    return table(
        ("input", "seconds", ""),
        [
            [
                f'<a href="{link(f"/batches/{group_id}/inputs/{i}", token)}">{i}</a>',
                human_seconds(s),
                "running" if running else "",
            ]
            for i, s, running in rows
        ],
    )


def grid(p: BatchProgress, group_id: str, token: str, offset: int) -> str:
    """The inputs of one region, a coloured cell each, linked to the input's page."""
    end = min(p.total, offset + REGION)
    cells = []
    for i in range(offset, end):
        state = _CELL[p.state_of(i)]
        href = link(f"/batches/{group_id}/inputs/{i}", token)
        cells.append(
            f'<a href="{href}" title="input {i}: {state}" style="background:{_COLORS[state]}"></a>'
        )
    nav = []
    if offset > 0:
        prev = link(f"/batches/{group_id}", token, offset=max(0, offset - REGION))
        nav.append(f'<a href="{prev}">← previous</a>')
    if end < p.total:
        nav.append(f'<a href="{link(f"/batches/{group_id}", token, offset=end)}">next →</a>')
    return (
        f"<p>inputs {offset}–{max(offset, end - 1)} of {p.total} &nbsp; {' '.join(nav)}</p>"
        f'<div class="grid">{"".join(cells)}</div>'
    )


def confirm(question: str, action: str, back: str, token: str) -> str:
    """The confirm step before a cancel: a POST form with the token, and a way back."""
    return (
        f"<h2>{escape(question)}</h2>"
        f'<form method="post" action="{escape(quote(action))}">'
        f'<input type="hidden" name="t" value="{escape(token)}">'
        f'<button class="danger" id="confirm" type="submit">Yes, cancel</button> '
        f'<a href="{back}">No, go back</a></form>'
    )


def state_name(code: int) -> str:
    return _CELL.get(code, STATE_NAMES.get(code, "pending"))
