"""A scripted expert receptionist: the clinic bot with a rule-based "LLM" that uses the tools right.

It runs the very same bot (`bot.run_bot`) with a `ScriptedLLMService` in place of the served
model, so it exercises the real pipeline, the real tool plumbing and the real world. Use it for
deterministic tests and to produce demonstration calls for warm-starting a small model (the
recorder writes its replies as demonstration turns, which `pipecat-rl train --algo sft` renders
with the served model's chat template):

    pipecat-rl simulate examples/clinic/handwritten/pool --bot examples/clinic/expert.py \
        --persona scripted --no-server
"""

import dataclasses
import json
import re

import bot
from pipecat.services.settings import LLMSettings

from pipecat_rl.simulator.scripted import ScriptedLLMService, ScriptedReply

NAME = re.compile(r"(?:name is|this is|it's|i'm|i am)?\s*([A-Z][a-z]+(?:[ -][A-Z][a-z]+)+)")
CONFIRMATION = re.compile(r"\b([A-Z]{2,4})[\s.-]*(\d{3,10}(?:[\s.,-]+\d{3,6}){0,2})\b")
SPOKEN_DIGITS = {"zero": "0", "oh": "0", "one": "1", "two": "2", "three": "3", "four": "4",
                 "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9"}  # fmt: skip
URGENT = re.compile(r"pain|emergency|swollen|broken|bleeding|today", re.IGNORECASE)
OFFERED = re.compile(r"slot (\d+)\. Shall I book it")
DECLINED = re.compile(r"don't work|doesn't work|another|other time|later|afternoon|can't make")
RETRIED = ("find_slots", "transfer")
"""Tools whose failure is the backend's (a timeout): call again, up to three tries in all."""
HOLDING = "One moment while I check that."
"""Said in the reply that starts a lookup, as production voice agents do: the caller hears
something at once instead of silence through every tool round (a slow or retried search
included). Worded to match none of the callers' intents, so no caller answers it."""


def _tool_results(messages: list[dict]) -> dict[str, object]:
    """The latest result of each tool, by name."""
    names = {}
    results: dict[str, object] = {}
    for m in messages:
        for call in m.get("tool_calls") or []:
            names[call["id"]] = call["function"]["name"]
        if m.get("role") == "tool" and m.get("content") != "IN_PROGRESS":
            try:
                results[names.get(m["tool_call_id"], "?")] = json.loads(m["content"])
            except (TypeError, ValueError):
                results[names.get(m["tool_call_id"], "?")] = m["content"]
    return results


def confirmation_number(said: str) -> str | None:
    """A confirmation number as a caller says it and an STT writes it, in the clinic's format.

    "DX 48213 77065", "DX48,213-77,065", "D-X four eight two one three ..." all read as
    DX-48213-77065: letters spelled one by one are joined, spoken digits become digits, the
    thousands commas an STT puts into long numbers are dropped, and ten digits however grouped
    are the clinic's 5-5 form (a receptionist knows its own number format).
    """
    text = said.upper()
    text = re.sub(r"\b([A-Z])[\s.-]+(?=[A-Z]\b)", r"\1", text)  # D-X, D. X. -> DX
    words = re.split(r"(\W+)", text)
    text = "".join(SPOKEN_DIGITS.get(w.lower(), w) for w in words)
    text = re.sub(r"(?<=\b\d)[\s,.-]+(?=\d\b)", "", text)  # 4 8 2, 4-8-2 -> 482
    text = re.sub(r"(?<=\d),(?=\d)", "", text)  # 48,213 -> 48213
    found = CONFIRMATION.search(text)
    if not found:
        return None
    groups = re.split(r"[\s.,-]+", found.group(2))
    digits = "".join(groups)
    if len(digits) == 10:  # however it was grouped aloud, the clinic's numbers are 5-5
        groups = [digits[:5], digits[5:]]
    return "-".join([found.group(1), *groups])


def _text(m: dict) -> str:
    return str(m.get("content") or "")


def _after_tool(messages: list[dict]) -> ScriptedReply:
    name = next(
        c["function"]["name"] for m in reversed(messages) for c in m.get("tool_calls") or []
    )
    result = _tool_results(messages).get(name)
    failed = isinstance(result, dict) and "error" in result
    if name == "lookup_patient":
        if failed:
            return ScriptedReply("I couldn't find that name. Could you spell it for me?")
        urgent = any(URGENT.search(_text(m)) for m in messages if m.get("role") == "user")
        kind = "emergency" if urgent else "routine"
        return ScriptedReply(tool_calls=[("find_slots", {"kind": kind})])
    if failed and name in RETRIED:
        tries = sum(
            1 for m in messages for c in m.get("tool_calls") or [] if c["function"]["name"] == name
        )
        if tries < 3:
            return ScriptedReply(tool_calls=[(name, json.loads(_last_args(messages)))])
        if name == "transfer":
            return ScriptedReply("I'm sorry, I can't put you through right now. Please call back.")
        return ScriptedReply("Our booking system is down. Let me transfer you.")
    if name == "find_slots":
        if not result:
            return ScriptedReply("I'm sorry, there are no free slots. Shall I transfer you?")
        slot = result[0]
        return ScriptedReply(
            f"I have {slot['day']} at {slot['time']} with {slot['dentist']}, slot {slot['id']}. "
            "Shall I book it?"
        )
    if name == "book":
        if failed:
            return ScriptedReply("The booking did not go through. Shall I try to book it again?")
        number = result["confirmation"]
        return ScriptedReply(f"You're booked. Your confirmation number is {number}.")
    if name == "cancel":
        if failed:
            return ScriptedReply("I can't find that confirmation number. Could you repeat it?")
        return ScriptedReply("Your appointment is cancelled.")
    return ScriptedReply("I'm transferring you to the front desk now.")


def _last_args(messages: list[dict], tool: str | None = None) -> str | None:
    """The arguments of the latest tool call (of `tool`, when named), else None."""
    return next(
        (
            c["function"]["arguments"]
            for m in reversed(messages)
            for c in m.get("tool_calls") or []
            if tool is None or c["function"]["name"] == tool
        ),
        None,
    )


def expert_policy(messages: list[dict]) -> ScriptedReply:
    """The expert receptionist's next move."""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return _after_tool(messages)
    said = _text(last)
    lower = said.lower()
    results = _tool_results(messages)
    prior = next((_text(m) for m in reversed(messages[:-1]) if m.get("role") == "assistant"), "")
    if "phone rings" in lower:
        return ScriptedReply("Thank you for calling Bright Smile Dental. How can I help you?")
    transferred = results.get("transfer")
    if transferred is not None and not (isinstance(transferred, dict) and "error" in transferred):
        # The call is already with the front desk: a second hand-over would be a second write,
        # whatever the caller says next (a late "please", a caller who missed the first words).
        return ScriptedReply("I've put you through to the front desk; please hold.")
    offered = OFFERED.search(prior)
    if re.search(r"\byes\b|please do|go ahead|sounds good", lower) and "book it" in prior:
        patient, slots = results.get("lookup_patient"), results.get("find_slots")
        tried = _last_args(messages, "book")  # a retry books the slot that failed
        # States only another agent reaches (a teacher answers them too: `--algo distill`): a
        # slot offered before the patient was found, or none found to book.
        if not isinstance(patient, dict) or "patient_id" not in patient:
            return ScriptedReply("Certainly. May I have your full name?")
        if not offered and not tried and not (isinstance(slots, list) and slots):
            return ScriptedReply(HOLDING, tool_calls=[("find_slots", {"kind": "routine"})])
        if offered:
            slot_id = int(offered.group(1))
        else:
            slot_id = json.loads(tried)["slot_id"] if tried else slots[0]["id"]
        return ScriptedReply(
            tool_calls=[("book", {"patient_id": patient["patient_id"], "slot_id": slot_id})]
        )
    if offered and DECLINED.search(lower):
        # The caller turned the offered slot down: offer the next free one of the same search.
        later = [s for s in results.get("find_slots") or [] if s["id"] > int(offered.group(1))]
        if not later:
            return ScriptedReply("I'm sorry, that was the last free slot. Shall I transfer you?")
        slot = later[0]
        return ScriptedReply(
            f"I also have {slot['day']} at {slot['time']} with {slot['dentist']}, slot "
            f"{slot['id']}. Shall I book it?"
        )
    if re.search(r"price|cost|how much|insurance", lower):
        return ScriptedReply("I can't quote prices on the phone; the front desk can help you.")
    if re.search(r"antibiotic|ibuprofen|medication|should i take|painkiller", lower):
        return ScriptedReply(
            "I can't give medical advice, but I can book you an emergency visit today."
        )
    if re.search(r"human|real person|manager|front desk|someone else", lower):
        return ScriptedReply(tool_calls=[("transfer", {"reason": said[:200]})])
    if "cancel" in lower or "confirmation" in prior.lower():
        number = confirmation_number(said)
        if number:
            return ScriptedReply(tool_calls=[("cancel", {"confirmation": number})])
        return ScriptedReply("Of course. What is your confirmation number?")
    name = NAME.search(said)
    if name and ("name" in prior.lower() or "spell" in prior.lower()):
        return ScriptedReply(HOLDING, tool_calls=[("lookup_patient", {"name": name.group(1)})])
    if re.search(r"book|appointment|checkup|cleaning|pain|emergency|see a dentist", lower):
        return ScriptedReply("Certainly. May I have your full name?")
    if re.search(r"\bno\b|that's all|bye|thank", lower):
        return ScriptedReply("Thank you for calling Bright Smile Dental. Goodbye!")
    return ScriptedReply("How can I help you today?")


def expert_llm() -> ScriptedLLMService:
    """The expert as an LLM service, with the bot's own system prompt.

    The recorder writes its replies as demonstrations with the request a served model would have
    seen, so the system instruction must be the bot's, exactly.
    """
    fields = {f.name: None for f in dataclasses.fields(LLMSettings) if f.name != "extra"}
    settings = LLMSettings(**{**fields, "model": "scripted", "system_instruction": bot.SYSTEM})
    return ScriptedLLMService(expert_policy, settings=settings)


async def run_bot(transport, runner_args):
    await bot.run_bot(transport, runner_args, llm=expert_llm())
