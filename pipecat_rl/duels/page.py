"""The duel page: server-rendered HTML, no CDN, a plain form that works without JavaScript.

The call up to the moment (its messages as the agent saw them, and the call's recording when
there is one), then the two replies side by side in the rater's left/right order. A pick is a
form post (buttons `1` / `2` / `=` / both bad, an optional note); with JavaScript the keys
`1`, `2`, `=` and `0` press those buttons.
"""

import json
from html import escape
from typing import Any

from pipecat_rl.ledger.duels import DuelRecord

_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:16px;color:#222}
h1{font-size:18px;margin:0 0 4px} .meta{color:#666;font-size:13px;margin-bottom:12px}
.call{border:1px solid #ddd;border-radius:6px;padding:8px 12px;margin-bottom:14px;
max-height:340px;overflow:auto;background:#fafafa}
.msg{margin:6px 0} .role{font-weight:600;font-size:12px;text-transform:uppercase;color:#555}
.replies{display:flex;gap:14px} .reply{flex:1;border:2px solid #bbb;border-radius:6px;
padding:10px 12px;white-space:pre-wrap;min-height:80px;background:#fff}
.reply h2{font-size:14px;margin:0 0 6px;color:#555} .picks{margin:14px 0;display:flex;gap:10px}
button{font-size:15px;padding:8px 16px;border-radius:6px;border:1px solid #888;cursor:pointer}
kbd{border:1px solid #aaa;border-radius:3px;padding:0 4px;font-size:12px;background:#eee}
textarea{width:100%;box-sizing:border-box;font:inherit}
"""

_KEYS = """
document.addEventListener('keydown', function (e) {
  if (e.target.tagName === 'TEXTAREA' || e.ctrlKey || e.metaKey || e.altKey) return;
  var b = document.querySelector('button[data-key="' + e.key + '"]');
  if (b) { e.preventDefault(); b.form.requestSubmit(b); }
});
"""

PICKS = {"left": "1", "right": "2", "tie": "=", "both_bad": "0"}
"""Each pick a form can post, and its key."""


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content) if content else ""
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        text += f"\n→ {fn.get('name')}({fn.get('arguments', '')})"
    return text.strip()


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
        f"<meta name=viewport content='width=device-width'><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>"
    )


def duel_page(duel: DuelRecord, rater: str, left_in_queue: int, audio_url: str | None) -> str:
    """The page of one duel for `rater`."""
    shown = duel.left_for(rater)
    sides = (duel.reply_a, duel.reply_b) if shown == "a" else (duel.reply_b, duel.reply_a)
    messages = "".join(
        f"<div class=msg><div class=role>{escape(str(m.get('role')))}</div>"
        f"{escape(_content(m))}</div>"
        for m in duel.context
        if m.get("role") != "system"
    )
    system = next((m for m in duel.context if m.get("role") == "system"), None)
    system_html = (
        f"<details><summary>system prompt</summary><pre>{escape(_content(system))}</pre></details>"
        if system
        else ""
    )
    audio = (
        f"<p>The call as recorded, up to this moment: <audio controls preload=none "
        f"src='{escape(audio_url)}'></audio></p>"
        if audio_url
        else ""
    )
    replies = "".join(
        f"<div class=reply id={side}><h2>{n}</h2>{escape(reply.text)}</div>"
        for n, (side, reply) in enumerate(zip(("left", "right"), sides, strict=True), start=1)
    )
    labels = {"left": "Left is better", "right": "Right is better", "tie": "Tie",
              "both_bad": "Both bad"}  # fmt: skip
    buttons = "".join(
        f"<button name=pick value={pick} data-key='{escape(key)}'>{labels[pick]} "
        f"<kbd>{escape(key)}</kbd></button>"
        for pick, key in PICKS.items()
    )
    body = (
        f"<h1>Which reply should the agent give next?</h1>"
        f"<div class=meta>rater <b>{escape(rater)}</b> · call {escape(duel.session_id)}, before "
        f"turn {duel.turn_index} · {left_in_queue} duel(s) left in your queue</div>"
        f"{audio}{system_html}<div class=call>{messages}</div>"
        f"<form method=post action='/duels/{escape(duel.id)}/vote'>"
        f"<input type=hidden name=rater value='{escape(rater)}'>"
        f"<div class=replies>{replies}</div><div class=picks>{buttons}</div>"
        f"<label>Note (optional)<textarea name=note rows=2 maxlength=2000></textarea></label>"
        f"</form><script>{_KEYS}</script>"
    )
    return _page(f"duel {duel.id}", body)


def done_page(rater: str, voted: int) -> str:
    """What a rater sees with nothing left in their queue."""
    return _page(
        "duels",
        f"<h1>Nothing left to rate, {escape(rater)}</h1><p>{voted} vote(s) of yours are in the "
        "ledger. New duels come from <code>pipecat-rl duels make</code>.</p>",
    )


def rater_page(problem: str | None = None) -> str:
    """A form asking who is rating (when the request names no rater)."""
    said = f"<p style='color:#b00'>{escape(problem)}</p>" if problem else ""
    return _page(
        "duels",
        f"<h1>Who is rating?</h1>{said}<form method=get action='/duels'>"
        "<label>Rater id <input name=rater pattern='[a-z0-9][a-z0-9_.\\-]{0,31}' required>"
        "</label> <button>Start</button></form>",
    )
