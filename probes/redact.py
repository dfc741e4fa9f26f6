"""Keep secrets out of everything trainwatch writes: environments, command lines, any text.

Rules:

* an environment value is shown only for an allowlisted name (torch, NCCL, CUDA, rank
  layout, ...); every other variable keeps its name and shows ``<redacted>``;
* a denylisted name (``*PASSWORD*``, ``*_TOKEN``, ``API_KEY`` ...) is redacted even when
  allowlisted: ``NCCL_AUTH_TOKEN`` stays hidden;
* credentials in URLs are stripped: ``https://user:pw@host`` -> ``https://<redacted>@host``;
* a :class:`Redactor` built from all ranks' environments also masks every redacted value
  (8 characters or more) and its base64 forms wherever else it appears.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping

MASK = "<redacted>"
MIN_SECRET_LEN = 8

ALLOW_PREFIXES = (
    "TORCH", "PYTORCH", "NCCL", "CUDA", "CUBLAS", "CUDNN", "NVIDIA", "OMP_", "MKL_",
    "SLURM_JOB", "PYTHON", "TRAINWATCH_",
)
ALLOW_NAMES = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "TOKENIZERS_PARALLELISM",
})
DENY_SUBSTRINGS = (
    "PASSWORD", "PASSWD", "SECRET", "PRIVATE_KEY", "API_KEY", "APIKEY", "ACCESS_KEY",
    "CREDENTIAL", "BEARER", "COOKIE", "SESSION",
)
DENY_WORDS = frozenset({"TOKEN", "KEY", "AUTH", "PASS", "PWD", "DSN"})
# Hidden in environment listings but not worth masking elsewhere: masking the host name or
# the locale everywhere would only make the bundle harder to read.
NOT_SECRET_VALUES = frozenset({"HOSTNAME", "HOST", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "SHELL",
                               "PWD", "OLDPWD"})

# In free text (a log line, an exception message): NAME=value / NAME: value, --flag value, and
# the shapes of well-known tokens.
_ASSIGNMENT = re.compile(r"(?<![\w-])(?P<name>[A-Za-z_][A-Za-z0-9_-]*)(?P<sep>\s*[=:]\s*)(?P<q>['\"]?)(?P<value>[^\s'\",;]{4,})")
_FLAG_VALUE = re.compile(r"(?P<flag>--?[A-Za-z][\w-]*)(?P<sep>=|\s+)(?P<value>[^\s-][^\s]*)")
_TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|sk-[A-Za-z0-9_-]{20,}"
    r"|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})"
)
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<cred>[^\s/@:]*:[^\s/@]*|[^\s/@:]+)@")


def is_secret_name(name: str) -> bool:
    """Denylisted: a secret-looking substring, or a whole ``_``-separated word like TOKEN."""
    upper = name.upper().replace("-", "_")
    if any(part in upper for part in DENY_SUBSTRINGS):
        return True
    return any(word in DENY_WORDS for word in upper.split("_"))


def is_visible_name(name: str) -> bool:
    """Allowlisted and not denylisted: the value may be shown."""
    if is_secret_name(name):
        return False
    return name in ALLOW_NAMES or name.upper().startswith(ALLOW_PREFIXES)


def strip_url_credentials(text: str) -> str:
    """``scheme://user:pw@host`` -> ``scheme://<redacted>@host`` everywhere in ``text``."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)


def scrub(text: str) -> str:
    """Mask what looks secret in free text without knowing any value: URL credentials,
    ``HF_TOKEN=…``/``password: …`` assignments and ``--token …`` flags by a secret-looking name,
    and well-known token shapes (``hf_…``, ``ghp_…``, ``sk-…``, AWS key ids, JWTs)."""
    text = strip_url_credentials(text)
    text = _ASSIGNMENT.sub(lambda m: (f"{m.group('name')}{m.group('sep')}{m.group('q')}{MASK}"
                                      if is_secret_name(m.group("name")) else m.group(0)), text)
    text = _FLAG_VALUE.sub(lambda m: (f"{m.group('flag')}{m.group('sep')}{MASK}"
                                      if is_secret_name(m.group("flag").lstrip("-")) else m.group(0)), text)
    return _TOKEN_SHAPES.sub(MASK, text)


def url_credentials(text: str) -> list[str]:
    """The ``user:pw`` parts (and the passwords alone) of URLs in ``text``."""
    found = []
    for match in _URL_CREDENTIALS.finditer(text):
        cred = match.group("cred")
        found.append(cred)
        if ":" in cred:
            found.append(cred.split(":", 1)[1])
    return found


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Allowlisted values (URL credentials stripped); every other name maps to ``<redacted>``."""
    return {name: strip_url_credentials(value) if is_visible_name(name) else MASK
            for name, value in sorted(env.items())}


def _flag_name(arg: str) -> str | None:
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    return arg.lstrip("-").split("=", 1)[0]


def redact_cmdline(args: Iterable[str]) -> tuple[str, ...]:
    """Hide the values of secret-looking flags (``--token X``, ``--api-key=X``) and URL credentials."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        name = _flag_name(arg)
        if name is not None and is_secret_name(name):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + MASK)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(strip_url_credentials(arg))
    return tuple(out)


def cmdline_secrets(args: Iterable[str]) -> list[str]:
    """The values :func:`redact_cmdline` hides, for masking them elsewhere."""
    found: list[str] = []
    args = list(args)
    for i, arg in enumerate(args):
        name = _flag_name(arg)
        if name is None or not is_secret_name(name):
            found.extend(url_credentials(arg))
            continue
        if "=" in arg:
            found.append(arg.split("=", 1)[1])
        elif i + 1 < len(args):
            found.append(args[i + 1])
    return found


def _encodings(value: str) -> list[str]:
    raw = value.encode()
    forms = {value}
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        text = encode(raw).decode()
        forms.add(text)
        forms.add(text.rstrip("="))
    return [f for f in forms if len(f) >= MIN_SECRET_LEN]


class Redactor:
    """Masks known secret values (and their base64 forms) in any text."""

    def __init__(self, secrets: Iterable[str] = (), enabled: bool = True) -> None:
        self.enabled = enabled
        forms: set[str] = set()
        for value in secrets:
            if value and len(value) >= MIN_SECRET_LEN:
                forms.update(_encodings(value))
        # Longest first, so a secret is masked whole before any shorter one inside it.
        ordered = sorted(forms, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(f) for f in ordered)) if ordered else None

    @classmethod
    def from_envs(cls, envs: Iterable[Mapping[str, str]], cmdlines: Iterable[Iterable[str]] = (),
                  enabled: bool = True) -> Redactor:
        """Every redacted value of every environment, plus secret flags and URL credentials."""
        secrets: list[str] = []
        for env in envs:
            for name, value in env.items():
                if name in NOT_SECRET_VALUES or name.startswith("LC_"):
                    pass  # PWD is the working directory, not a password
                elif is_secret_name(name):
                    secrets.append(value)
                elif not is_visible_name(name) and not value.startswith("/"):
                    # Plain paths (HOME, VIRTUAL_ENV) are not secrets; masking them would
                    # blank out every file name in the stacks.
                    secrets.append(value)
                secrets.extend(url_credentials(value))
        for args in cmdlines:
            secrets.extend(cmdline_secrets(args))
        return cls(secrets, enabled=enabled)

    def text(self, text: str) -> str:
        """``text`` with every known secret, URL credential and secret flag value masked."""
        if not self.enabled:
            return text
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        return strip_url_credentials(text)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return dict(env) if not self.enabled else {k: self.text(v) for k, v in redact_env(env).items()}

    def cmdline(self, args: Iterable[str]) -> tuple[str, ...]:
        args = tuple(args)
        return args if not self.enabled else tuple(self.text(a) for a in redact_cmdline(args))


def redact_argv(args: Iterable[str]) -> list[str]:
    """:func:`redact_cmdline` as a list (what ``trainwatch snapshot --json`` uses for command lines)."""
    return list(redact_cmdline(args))
