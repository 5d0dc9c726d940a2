"""The card map of `tessera status --svg`: each GPU a bar of its memory, its shares and MIG instances as
segments labelled by pod, what is free in grey. Plain SVG 1.1, no scripts, no external references."""

from __future__ import annotations

from functools import partial
from xml.sax.saxutils import escape

from controller.explain.status import GpuStatus, Segment, StatusReport
from driver.quantity import format_bytes

_size = partial(format_bytes, approximate=True)  # memory in tables and card maps: 40Gi, 79.6Gi

WIDTH = 960
LABEL_W = 230
BAR_X = LABEL_W + 10
BAR_W = WIDTH - BAR_X - 140
ROW_H = 34
BAR_H = 24
NODE_H = 26
CHAR_W = 6.2  # average glyph width at font-size 11, to fit labels in their segments
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#6b8e23")


def _fit(text: str, width: float) -> str:
    room = int((width - 8) / CHAR_W)
    if room <= 1:
        return ""
    return text if len(text) <= room else text[: room - 1] + "\u2026"


def _spans(g: GpuStatus) -> list[tuple[Segment, float, float]]:
    """(segment, x, width) on the bar: MIG instances where their memory slices are, memory from the left."""
    out = []
    cursor = 0.0
    for s in g.segments:
        if s.slices is not None and g.memory_slices:
            start, size = s.slices
            out.append((s, BAR_W * start / g.memory_slices, BAR_W * size / g.memory_slices))
            continue
        width = BAR_W * min(s.memory / g.memory, 1.0) if g.memory else 0.0
        out.append((s, cursor, width))
        cursor += width
    return out


def _colour(colours: dict[str, str], key: str) -> str:
    if key not in colours:
        colours[key] = PALETTE[len(colours) % len(PALETTE)]
    return colours[key]


def _product(g: GpuStatus) -> str:
    return f"{g.product} \u00b7 MIG" if g.mig != "none" else g.product


def _gpu(g: GpuStatus, y: float, colours: dict[str, str]) -> list[str]:
    name = g.name if g.published else f"{g.name} (MIG)"
    parts = [
        f'<text x="16" y="{y + 11}" class="gpu">{escape(name)}</text>',
        f'<text x="16" y="{y + 24}" class="sub">{escape(_fit(_product(g), LABEL_W - 16))}</text>',
        f'<rect x="{BAR_X}" y="{y}" width="{BAR_W}" height="{BAR_H}" class="free"><title>'
        f"{escape(f'{g.node}/{g.name}: {_size(g.free)} of {_size(g.memory)} free')}</title></rect>",
    ]
    for i in range(1, g.memory_slices):  # MIG memory-slice boundaries
        x = BAR_X + BAR_W * i / g.memory_slices
        parts.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + BAR_H}" class="tick"/>')
    for s, x, w in _spans(g):
        colour = _colour(colours, s.label)
        what = f"MIG {s.profile} at slice {s.placement}" if s.kind == "mig" else \
            ("whole GPU" if s.kind == "whole" else f"{_size(s.memory)} share")
        tip = f"{g.node}/{s.device}: {what}, claim {s.claim}, pod {', '.join(s.pods) or '-'}"
        parts.append(f'<rect x="{BAR_X + x:.1f}" y="{y}" width="{max(w, 1):.1f}" height="{BAR_H}" fill="{colour}" '
                     f'class="seg"><title>{escape(tip)}</title></rect>')
        short = s.label.split("/", 1)[-1]
        label = f"{short} {s.profile or ('' if s.kind == 'whole' else _size(s.memory))}".strip()
        text = label if _fit(label, w) == label else _fit(short, w)  # the pod before the amount
        if text:
            parts.append(f'<text x="{BAR_X + x + 4:.1f}" y="{y + 16}" class="lbl">{escape(text)}</text>')
    free = f"{_size(g.free)} free of {_size(g.memory)}" if g.free else f"full ({_size(g.memory)})"
    parts.append(f'<text x="{BAR_X + BAR_W + 8}" y="{y + 16}" class="freetext">{escape(free)}</text>')
    return parts


def status_svg(report: StatusReport, title: str = "tessera status") -> str:
    colours: dict[str, str] = {}
    body: list[str] = []
    y = 44.0
    for node in report.nodes:
        body.append(f'<text x="8" y="{y + 16}" class="node">{escape(node.name)}</text>')
        y += NODE_H
        for g in node.gpus:
            body.extend(_gpu(g, y, colours))
            y += ROW_H
        y += 8
    gpus = [g for n in report.nodes for g in n.gpus]
    summary = (f"{len(gpus)} GPUs on {len(report.nodes)} nodes: {_size(sum(g.free for g in gpus))} of "
               f"{_size(sum(g.memory for g in gpus))} GPU memory free; segments are labelled by pod")
    height = int(y + 30)
    style = (".node{font:bold 14px sans-serif;fill:#222}.gpu{font:bold 11px monospace;fill:#222}"
             ".sub{font:10px sans-serif;fill:#666}.lbl{font:11px sans-serif;fill:#fff}"
             ".free{fill:#e6e6e6;stroke:#bbb}.freetext{font:11px sans-serif;fill:#444}"
             ".title{font:bold 16px sans-serif;fill:#222}.summary{font:11px sans-serif;fill:#444}"
             ".seg{stroke:#fff;stroke-width:1}.tick{stroke:#c8c8c8;stroke-width:1}")
    head = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}">',
        f"<title>{escape(title)}</title>",
        f"<style>{style}</style>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#fff"/>',
        f'<text x="8" y="24" class="title">{escape(title)}</text>',
    ]
    tail = [f'<text x="8" y="{height - 10}" class="summary">{escape(summary)}</text>', "</svg>"]
    return "\n".join(head + body + tail) + "\n"

