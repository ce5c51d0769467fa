"""One student's feedback as a self-contained HTML page: verdicts, messages, what to fix.

The page holds that student's grade and nothing else: no classmate's name, no other
row of the class, no script. Everything the submission or a check wrote is escaped,
so a message that holds markup shows as text.
"""

from __future__ import annotations

from html import escape

from ddtk.gradebook import Grade, number

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; color: #222; }
h1 { font-size: 1.4rem; margin-bottom: .2rem; } .sub { color: #555; margin-top: 0; }
table { border-collapse: collapse; width: 100%; margin-top: 1rem; }
th, td { border-bottom: 1px solid #ddd; padding: .45rem .5rem; text-align: left; vertical-align: top; }
td.pts { white-space: nowrap; text-align: right; }
.pass { color: #17702b; font-weight: 600; } .fail { color: #b3261e; font-weight: 600; }
.error { color: #8a5a00; font-weight: 600; } .fix { color: #444; margin-top: .3rem; }
pre { white-space: pre-wrap; margin: 0; font: 13px/1.4 ui-monospace, monospace; }
.box { background: #fff6e0; border: 1px solid #e8c66b; padding: .6rem .8rem; margin-top: 1rem; }
"""
_VERDICT = {"pass": "passed", "fail": "not yet", "error": "error"}


def _row(item) -> str:
    message = f"<pre>{escape(item.message)}</pre>" if item.message else ""
    fix = f'<div class="fix">What to do: {escape(item.fix)}</div>' if item.fix else ""
    return (
        f"<tr><td>{escape(item.number)}</td><td>{escape(item.name)}</td>"
        f'<td class="{item.status}">{_VERDICT[item.status]}</td>'
        f'<td class="pts">{number(item.score)} / {number(item.max_score)}</td>'
        f"<td>{message}{fix}</td></tr>"
    )


def feedback_html(grade: Grade) -> str:
    """The page for ``grade``'s student."""
    title = f"{grade.title}: feedback for {grade.student}"
    head = (f'<h1>{escape(grade.title)}</h1><p class="sub">{escape(grade.student)}: '
            f"<strong>{number(grade.score)} of {number(grade.max_score)} points</strong>"
            f" ({_VERDICT[grade.status]})</p>")  # fmt: skip
    boxes = []
    if grade.error:
        boxes.append(f'<div class="box">Not fully graded: {escape(grade.error)}</div>')
    boxes += [f'<div class="box">{escape(n)}</div>' for n in grade.notes]
    rows = "".join(_row(i) for i in grade.items)
    table = (
        "<table><thead><tr><th>#</th><th>exercise</th><th>verdict</th><th>points</th>"
        f"<th>the check said</th></tr></thead><tbody>{rows}</tbody></table>"
        if grade.items
        else ""
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{head}{''.join(boxes)}{table}</body></html>\n"
    )


__all__ = ["feedback_html"]
