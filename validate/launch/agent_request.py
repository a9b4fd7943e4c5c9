"""What the validator may ask a node agent to run (validate.launch.shared_dir), and how the agent knows the validator
asked: the secret they share, the signature of every file they exchange, and the launch request's format.

Every file of the exchange is a signed message, `{"kind": K, "body": {...}, "mac": HEX}`: HMAC-SHA256, keyed with the
secret, over K and the body's canonical JSON (sorted keys, no spaces), so a message of one kind (a report) is never
taken for another (a request). The secret is a file only its user can read (`--secret-file`; `new_secret` makes
one), the same on every host and for the validator.

A launch request names only what varies: the run and the launch's index in it, the nodes taking part, workers per
node, the program with its arguments and its environment, and each agent's nonce (a random number an agent draws at
start and announces; a request for an earlier start of an agent, replayed, does not carry it). The rendezvous
endpoint and id follow from the agent's own --hosts and --port and from the run. The program is one of PROGRAMS:
validate.ranks.worker runs the training runs and, with --calibrate, the calibration microbenchmarks; its arguments
are checked against its own command line (paths relative to the workdir, choices, bounded numbers) and its
environment takes only ENV keys: PYTHONPATH is the agent's own repository, and nothing else (LD_PRELOAD, ...) comes
from a request.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from simfog.errors import ConfigError
from validate.launch.private_files import check_folders_down, open_private, read_private

REPO = Path(__file__).resolve().parents[2]
WORKER = "validate.ranks.worker"
PROGRAMS = (WORKER,)  # the calibration microbenchmarks are the same program with --calibrate
# validate.ranks.worker's options (its main(); BACKENDS there, PRIORITIES in validate.cluster.scheduling):
# None for a flag, a tuple of choices, or "seconds" (a finite number in (0, MAX_SECONDS])
WORKER_OPTIONS: dict[str, tuple[str, ...] | str | None] = {
    "--calibrate": None, "--priority": ("rt", "nice", "none"), "--timeout": "seconds", "--backend": ("gloo", "nccl")}
ENV = ("OMP_NUM_THREADS",)  # validate.run's rank environment, less PYTHONPATH (the agent's own)
MAX_SECONDS = 1e6
MAX_LAUNCHES = 1_000_000
MAX_WORKERS_PER_NODE = 1024
MAX_THREADS = 4096
SECRET_MIN_BYTES = 16
NONCE_HEX = 32
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
PATH_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=@-]{0,254}")
NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?")
MAC_HEX = re.compile(r"[0-9a-f]{64}")
REQUEST_FIELDS = ("run", "k", "nodes", "nproc_per_node", "module", "args", "env", "agents")
# torchrun sets these for its own workers; the agent's own, if any, must not reach them
TORCHRUN_SETS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")


class RequestError(ConfigError):
    """A message or request refused: it names the field, the value and what is allowed (and the file, as source)."""


@dataclass(frozen=True)
class LaunchRequest:
    """One launch, checked (parse_request): `run` (its folder's name under launches/), `k` (the launch's index in
    it), `nodes` (indices into the hosts, increasing), `nproc_per_node` workers each running `module` (one of
    PROGRAMS) with `args` (paths relative to the workdir) and `env` (ENV keys only), `agents` (each node's nonce)."""

    run: str
    k: int
    nodes: tuple[int, ...]
    nproc_per_node: int
    module: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    agents: tuple[str, ...]

    def body(self) -> dict:
        """The request as the JSON body the validator signs."""
        return {"run": self.run, "k": self.k, "nodes": list(self.nodes), "nproc_per_node": self.nproc_per_node,
                "module": self.module, "args": list(self.args), "env": dict(self.env), "agents": list(self.agents)}


# --- the secret and the signature -------------------------------------------------------------------------------

def new_secret(path: str | Path) -> Path:
    """Write a new secret (32 random bytes as hex) to `path`, which must not exist, readable by its user only.
    Raises ConfigError."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise ConfigError("--new-secret", str(path), "a file that does not exist yet (a secret is never "
                          "overwritten)") from None
    except OSError as e:
        raise ConfigError("--new-secret", str(path), f"a file that can be created ({e.strerror})") from None
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return path


def load_secret(path: str | Path) -> bytes:
    """The secret in file `path`: a regular file (not a link) of yours or root's that group and others can neither
    read nor write, holding at least SECRET_MIN_BYTES bytes (surrounding white space ignored). Raises ConfigError."""
    path = Path(path)
    how = f"(make one with `python -m validate.launch.shared_dir --new-secret {path}`)"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError("--secret-file", str(path), f"an existing regular file, not a link ({e.strerror}) "
                          f"{how}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("--secret-file", str(path), f"a regular file {how}")
        if st.st_uid not in (os.geteuid(), 0) or mode & 0o077:
            raise ConfigError("--secret-file", str(path), f"a file of yours that only you can read and write (it is "
                              f"owned by uid {st.st_uid}, mode {mode:o}: chmod 600 it, or make a new one) {how}")
        secret = f.read(4096).strip()
    if len(secret) < SECRET_MIN_BYTES:
        raise ConfigError("--secret-file", str(path), f"at least {SECRET_MIN_BYTES} bytes of secret {how}")
    return secret


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _mac(kind: str, body: dict, secret: bytes) -> str:
    return hmac.new(secret, kind.encode() + b"\n" + _canonical(body), hashlib.sha256).hexdigest()


def seal(kind: str, body: dict, secret: bytes) -> bytes:
    """The signed message of `kind` ("request", "report", ...) carrying `body`, as the bytes of a file."""
    return json.dumps({"kind": kind, "body": body, "mac": _mac(kind, body, secret)}).encode()


def _json(raw: bytes | str, source: str | None):
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:  # ValueError: JSONDecodeError, UnicodeDecodeError, huge integers
        raise RequestError("content", _preview(raw), f"JSON ({type(e).__name__})", source=source) from None


def _preview(raw) -> str:
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return text[:60]


def unseal(raw: bytes | str, kind: str, secret: bytes, *, source: str | None = None) -> dict:
    """The body of the signed message `raw` of `kind`, once its signature is checked (constant-time compare).
    Raises RequestError naming `source` (the file)."""
    doc = _json(raw, source)
    if not isinstance(doc, dict) or set(doc) != {"kind", "body", "mac"}:
        raise RequestError("message", _preview(raw), 'a signed message {"kind", "body", "mac"} (made by the '
                           'validator or an agent with the shared secret)', source=source)
    if doc["kind"] != kind:
        raise RequestError("kind", doc["kind"], f"{kind!r}", source=source)
    if not isinstance(doc["body"], dict) or not isinstance(doc["mac"], str) or not MAC_HEX.fullmatch(doc["mac"]):
        raise RequestError("mac", doc["mac"], "64 hex digits signing a JSON object body", source=source)
    try:
        expected = _mac(kind, doc["body"], secret)
    except ValueError:  # NaN or infinity in the body: no canonical form, and never signed
        raise RequestError("body", _preview(raw), "JSON without NaN or infinity", source=source) from None
    if not hmac.compare_digest(expected, doc["mac"]):
        raise RequestError("mac", doc["mac"][:16] + "...", "the signature of the secret this side holds (not "
                           "signed with it: written by someone else, or the validator and the agents were given "
                           "different --secret-file)", source=source)
    return doc["body"]


def read_message(path: Path, kind: str, secret: bytes, root: Path) -> dict | None:
    """The body of the signed message of `kind` in file `path` under the workdir `root` (read_private), None when
    there is none. Raises ConfigError (RequestError, UnsafeFile)."""
    raw = read_private(path, root)
    return None if raw is None else unseal(raw, kind, secret, source=str(path))


# --- the launch request ------------------------------------------------------------------------------------------

def _int(field: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(field, value, f"an integer in [{low}, {high}]")
    return value


def run_name(value, field: str = "run") -> str:
    """`value` if it names a run folder (letters, digits, - and _; no path), else RequestError."""
    if not isinstance(value, str) or not RUN_NAME.fullmatch(value):
        raise RequestError(field, value, "a run name: letters, digits, '-' and '_' (at most 64; no '/' or '..')")
    return value


def _relative_path(field: str, value) -> str:
    if not isinstance(value, str) or len(value) > 1024 or not all(PATH_PART.fullmatch(p) for p in value.split("/")):
        raise RequestError(field, value, "a path relative to the workdir: parts of letters, digits and _.+=@- "
                           "separated by '/', none starting with '.' or '-' (no '..', not absolute)")
    return value


def _option_value(field: str, kind, value) -> str:
    if isinstance(kind, tuple):
        if value not in kind:
            raise RequestError(field, value, f"one of {', '.join(kind)}")
        return value
    if not isinstance(value, str) or not NUMBER.fullmatch(value) or not 0 < float(value) <= MAX_SECONDS:
        raise RequestError(field, value, f"a number of seconds in (0, {MAX_SECONDS:g}]")
    return value


def worker_args(args) -> tuple[str, ...]:
    """validate.ranks.worker's arguments, checked: the spec (a .json file) and output folder, relative to the
    workdir, then each of WORKER_OPTIONS at most once. Raises RequestError."""
    if not isinstance(args, list) or len(args) < 2 or not all(isinstance(a, str) for a in args):
        raise RequestError("args", args, "a list of strings: the spec file and the output folder (relative to the "
                           f"workdir), then options among {', '.join(WORKER_OPTIONS)}")
    spec, out = _relative_path("args[0]", args[0]), _relative_path("args[1]", args[1])
    if not spec.endswith(".json"):
        raise RequestError("args[0]", spec, "the run spec or calibration plan, a .json file")
    seen, i = set(), 2
    while i < len(args):
        option = args[i]
        if option not in WORKER_OPTIONS or option in seen:
            raise RequestError(f"args[{i}]", option, f"one of {', '.join(sorted(set(WORKER_OPTIONS) - seen))} "
                               "(each at most once)")
        seen.add(option)
        kind = WORKER_OPTIONS[option]
        if kind is not None:
            if i + 1 == len(args):
                raise RequestError(f"args[{i}]", option, "followed by its value")
            _option_value(f"args[{i + 1}] ({option})", kind, args[i + 1])
        i += 1 if kind is None else 2
    return (spec, out, *args[2:])


def _env(env) -> tuple[tuple[str, str], ...]:
    if not isinstance(env, dict):
        raise RequestError("env", env, "an object of environment variables")
    for key, value in env.items():
        if key not in ENV:
            raise RequestError("env", key, f"only {', '.join(ENV)}: the agent sets PYTHONPATH itself (its own "
                               "repository), and takes nothing else from a request (LD_PRELOAD, LD_LIBRARY_PATH, ...)")
        if not isinstance(value, str) or not value.isascii() or not value.isdigit() \
                or not 1 <= int(value) <= MAX_THREADS:
            raise RequestError(f"env.{key}", value, f"a thread count, 1 to {MAX_THREADS}")
    return tuple(sorted(env.items()))


def parse_request(raw: bytes | str | dict, n_hosts: int) -> LaunchRequest:
    """The launch request `raw` (its JSON body, as bytes, text or a dict) for a cluster of `n_hosts` hosts, checked
    field by field: a LaunchRequest, or RequestError naming the field, the value and what is allowed. Pure: no file
    is read (the agent then checks the paths with `rank_argv`)."""
    body = raw if isinstance(raw, dict) else _json(raw, None)
    if not isinstance(body, dict) or set(body) != set(REQUEST_FIELDS):
        got = sorted(body) if isinstance(body, dict) else body
        raise RequestError("request", got, f"an object with exactly the fields {', '.join(REQUEST_FIELDS)}")
    nodes = body["nodes"]
    if not isinstance(nodes, list) or not nodes:
        raise RequestError("nodes", nodes, f"a non-empty list of node indices below {n_hosts}")
    for node in nodes:
        _int("nodes[]", node, 0, n_hosts - 1)
    if any(a >= b for a, b in zip(nodes, nodes[1:])):
        raise RequestError("nodes", nodes, "node indices in increasing order, each once")
    if body["module"] not in PROGRAMS:
        raise RequestError("module", body["module"], f"one of {', '.join(PROGRAMS)} (the agents run nothing else)")
    agents = body["agents"]
    if not isinstance(agents, list) or len(agents) != n_hosts or \
            not all(isinstance(a, str) and re.fullmatch(f"[0-9a-f]{{{NONCE_HEX}}}", a) for a in agents):
        raise RequestError("agents", agents, f"the {n_hosts} agents' nonces ({NONCE_HEX} hex digits each)")
    return LaunchRequest(run_name(body["run"]), _int("k", body["k"], 0, MAX_LAUNCHES), tuple(nodes),
                         _int("nproc_per_node", body["nproc_per_node"], 1, MAX_WORKERS_PER_NODE), body["module"],
                         worker_args(body["args"]), _env(body["env"]), tuple(agents))


def request_args(module: str, args: list[str], root: Path) -> list[str]:
    """The validator's side: `module`'s arguments as a request carries them (the spec and output folder relative to
    the workdir `root`). Raises ConfigError for a program the agents do not run or a path outside the workdir."""
    if module not in PROGRAMS or len(args) < 2:
        raise ConfigError("rank program", [module, *args[:2]], f"{WORKER} SPEC OUT [options] (the only program the "
                          "node agents run)")
    rel = []
    for a in args[:2]:
        try:
            rel.append(Path(a).resolve().relative_to(root).as_posix())
        except ValueError:
            raise ConfigError("rank program argument", a, f"a path inside the workdir {root}") from None
    return [*rel, *args[2:]]


def rank_argv(request: LaunchRequest, root: Path) -> list[str]:
    """The agent's side: the program's command line with its paths under the workdir `root`, once the spec is a
    file and the output a folder that no other user can write (validate.launch.private_files). Raises
    RequestError."""
    spec, out = root / request.args[0], root / request.args[1]
    fd = open_private(spec, root)
    if fd is None:
        raise RequestError("args[0]", request.args[0], f"an existing file under the workdir {root}")
    os.close(fd)
    try:
        check_folders_down(root, out)
    except FileNotFoundError:
        raise RequestError("args[1]", request.args[1], f"an existing folder under the workdir {root}") from None
    return [sys.executable, "-m", request.module, str(spec), str(out), *request.args[2:]]


def rank_env(request: LaunchRequest) -> dict[str, str]:
    """The workers' environment: the agent's own, less what torchrun sets for its workers, with PYTHONPATH leading
    to the agent's repository, and the request's ENV keys."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_SETS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**env, **dict(request.env)}
