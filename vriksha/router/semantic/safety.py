"""Cheap safety signals at the regex level: jailbreak / prompt-injection phrasings and PII.

PII caught: e-mail addresses, phone numbers (international +CC or 10-digit North American forms),
payment card numbers (13-19 digits, Luhn-checked), US social security numbers (AAA-GG-SSSS), IBANs
(country code + check digits + 11-30 alphanumerics), IPv4 addresses. Not caught: names, postal addresses,
dates of birth, national IDs of other countries, anything paraphrased ("my card ends in four two ...").

Jailbreak / injection caught: requests to ignore or override earlier instructions, to reveal the system
prompt, role-play as an unrestricted model (DAN, "developer mode", "no restrictions"), and fake
system/instruction markers inside the user's text. A determined attacker gets past regexes; this catches
the common copy-paste attacks cheaply and is meant to be combined with other signals.

Every scan is linear in the text: no pattern can backtrack over more than a bounded stretch (a `\s*` that
could cross lines made a 120 KB message of newlines take minutes), and e-mail addresses are found from each
`@` (a local part of at most 64 characters before it, RFC 5321's bound) instead of a regex retried from every
position of a long run of address characters.
"""

from __future__ import annotations

import re
import string

_JAILBREAK = [
    r"\b(ignore|disregard|forget|override|bypass)\b.{0,40}\b(previous|prior|above|earlier|all|your|the)\b.{0,30}"
    r"\b(instructions?|rules|prompts?|guidelines|directives|polic(y|ies))",
    r"\b(reveal|print|show|repeat|output|leak|tell me)\b.{0,30}\b(system|hidden|initial|original)\s+"
    r"(prompt|instructions?|message)",
    r"\b(you are|act as|pretend to be|become)\b.{0,30}\b(DAN|do anything now|jailbroken|unfiltered|"
    r"uncensored|unrestricted|evil)\b",
    r"\bdeveloper mode\b",
    r"\b(no|without( any)?) (restrictions|filters|limitations|guardrails|censorship|rules)\b",
    r"(^|\n)[^\S\n]*(\[/?(system|INST)\]|<\|?(system|im_start)\|?>|###[^\S\n]*(system|instruction))",
    r"\bjailbreak(ing)?\b",
]
JAILBREAK = [re.compile(p, re.IGNORECASE | re.DOTALL) for p in _JAILBREAK]

_LOCAL_CHARS = frozenset(string.ascii_letters + string.digits + "._%+-")
_LOCAL_MAX = 64
_DOMAIN = re.compile(r"[A-Za-z0-9.-]+?\.[A-Za-z]{2,}\b")  # from just after an @; lazy: stops at the first TLD


def has_email(text: str) -> bool:
    """An address `local@domain.tld`: a local part with a letter or digit among the (at most 64) address
    characters before an `@`, a domain of letters, digits, dots and hyphens after it ending in a dot and two
    or more letters."""
    at = text.find("@")
    while at != -1:
        start = at
        while start > 0 and at - start < _LOCAL_MAX and text[start - 1] in _LOCAL_CHARS:
            start -= 1
        local = text[start:at]
        if any(c.isalnum() for c in local) and _DOMAIN.match(text, at + 1):
            return True
        at = text.find("@", at + 1)
    return False


PII = {
    "phone": re.compile(r"(?<![\w+])(\+\d{1,3}[\s.-]?)?(\(\d{3}\)|\d{3})[\s.-]\d{3}[\s.-]\d{4}\b"),
    "card": re.compile(r"\b(?:\d[ -]?){12,18}\d\b"),
    "ssn": re.compile(r"\b(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}\b"),
    "iban": re.compile(r"\b[A-Z]{2}\d{2}(?:\s?[A-Z0-9]{4}){2,7}(?:\s?[A-Z0-9]{1,4})?\b"),
    "ipv4": re.compile(r"\b(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)\b"),
}
PII_KINDS = ("email", *PII)


def luhn_ok(digits: str) -> bool:
    total, alt = 0, False
    for ch in reversed(digits):
        d = ord(ch) - 48
        if alt:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
        alt = not alt
    return total % 10 == 0


def jailbreak(text: str) -> str | None:
    """The first matching phrase, or None."""
    for pattern in JAILBREAK:
        m = pattern.search(text)
        if m:
            return m.group(0)[:60]
    return None


def pii(text: str, kinds: list[str] | None = None) -> list[str]:
    """The PII kinds found in `text` (in `PII_KINDS` order)."""
    found = []
    if (kinds is None or "email" in kinds) and has_email(text):
        found.append("email")
    for kind, pattern in PII.items():
        if kinds is not None and kind not in kinds:
            continue
        for m in pattern.finditer(text):
            if kind == "card":
                digits = re.sub(r"\D", "", m.group(0))
                if not (13 <= len(digits) <= 19 and luhn_ok(digits)):
                    continue
            found.append(kind)
            break
    return found
