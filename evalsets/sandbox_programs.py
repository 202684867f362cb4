"""The programs of the sandbox's two processes, as text: the wire format both speak, the answer's
server and the judge that runs the tests; compiled once per interpreter (evalsets/sandbox.py
says why the verdict can come only from the judge)."""

from __future__ import annotations

import functools
import subprocess

# Shared by both processes: frames (a 4-byte length, then one value). A value is a tag byte and
# its body: N None, T True, F False, i<hex>; int, f<repr>; float, c<float><float> complex,
# s<n>:<n bytes of UTF-8> str, b<n>:<n bytes> bytes, y bytearray, l<n>; list of n values,
# t tuple, S set, z frozenset, d<n>; dict of n key-value pairs, r<n>; a handle: an object left in
# the answer's process. Decoding builds plain data only (nothing received runs) and imports
# nothing: `json` would cost each process milliseconds.
_WIRE = r"""
import builtins, marshal, os, sys

MAX_FRAME = 64 << 20
MAX_DEPTH = 100
SINGLE = {b"N": None, b"T": True, b"F": False}
SIZED = {b"s": str, b"b": bytes, b"y": bytearray}
SEQUENCES = {b"l": list, b"t": tuple, b"S": set, b"z": frozenset, b"d": dict}
TAGS = {kind: tag for tag, kind in [*SIZED.items(), *SEQUENCES.items()]}
BASES = ((int, int.__int__), (float, float.__float__), (str, str.__str__), (complex, complex),
         (list, list), (tuple, tuple), (dict, dict), (set, set), (frozenset, frozenset),
         (bytes, bytes), (bytearray, bytearray))


class Broken(BaseException):
    '''The other process closed the connection, or sent what is not a message.'''


def encode(value, handle):
    '''`value` as bytes: plain data as itself (a subclass of it as its base), anything else as
    the handle number handle(value) gives it.'''
    out = []
    put(value, handle, out, 0)
    return b"".join(out)


def put(value, handle, out, depth):
    kind = type(value)
    if value is None or kind is bool:
        out.append(b"N" if value is None else b"T" if value else b"F")
    elif kind is int:
        out.append(b"i%x;" % value)
    elif kind is float:
        out.append(b"f%r;" % value)
    elif kind is str or kind is bytes or kind is bytearray:
        data = value.encode("utf-8", "surrogatepass") if kind is str else value
        out += [b"%s%d:" % (TAGS[kind], len(data)), bytes(data)]
    elif kind is complex:
        out += [b"c", b"f%r;" % value.real, b"f%r;" % value.imag]
    elif kind in TAGS:
        if depth >= MAX_DEPTH:
            raise ValueError("nested too deeply")
        out.append(b"%s%d;" % (TAGS[kind], len(value)))
        for item in (value if kind is not dict else [part for pair in value.items() for part in pair]):
            put(item, handle, out, depth + 1)
    else:
        for base, plain in BASES:
            if isinstance(value, base):
                return put(plain(value), handle, out, depth)
        out.append(b"r%d;" % handle(value))


def listed(*parts):
    '''A list from values already encoded.'''
    return b"l%d;" % len(parts) + b"".join(parts)


def decode(data, resolve):
    '''The value `data` holds; resolve(n) is what stands for handle n on this side.'''
    value, end = take(data, 0, resolve, 0)
    if end != len(data):
        raise ValueError("bytes after the value")
    return value


def take(data, at, resolve, depth):
    tag, at = data[at:at + 1], at + 1
    if tag in SINGLE:
        return SINGLE[tag], at
    if tag == b"c":
        real, at = take(data, at, resolve, depth)
        imag, at = take(data, at, resolve, depth)
        if type(real) is not float or type(imag) is not float:
            raise ValueError("a complex number of other than floats")
        return complex(real, imag), at
    stop = data.index(b":" if tag in SIZED else b";", at)
    field, at = data[at:stop], stop + 1
    if tag == b"i":
        return int(field, 16), at
    if tag == b"f":
        return float(field), at
    if tag == b"r":
        return resolve(int(field)), at
    size = int(field)
    if size < 0 or size > len(data) - at:
        raise ValueError(f"a size of {size} in a message of {len(data)} bytes")
    if tag in SIZED:
        chunk = data[at:at + size]
        return (chunk.decode("utf-8", "surrogatepass") if tag == b"s" else SIZED[tag](chunk)), at + size
    if tag not in SEQUENCES:
        raise ValueError(f"not a value: tag {tag!r}")
    if depth >= MAX_DEPTH:
        raise ValueError("nested too deeply")
    items = []
    for _ in range(size * 2 if tag == b"d" else size):
        item, at = take(data, at, resolve, depth + 1)
        items.append(item)
    if tag == b"d":
        return dict(zip(items[::2], items[1::2])), at
    return SEQUENCES[tag](items), at


def send(fd, data):
    data = len(data).to_bytes(4, "big") + data
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        raise Broken("closed") from None


def read_exactly(fd, size):
    parts = []
    while size:
        try:
            part = os.read(fd, min(size, 1 << 20))
        except OSError:
            part = b""
        if not part:
            raise Broken("closed")
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def receive(fd, resolve):
    size = int.from_bytes(read_exactly(fd, 4), "big")
    if size > MAX_FRAME:
        raise Broken(f"a message of {size} bytes (at most {MAX_FRAME})")
    try:
        return decode(read_exactly(fd, size), resolve)
    except (ValueError, TypeError, IndexError, KeyError, RecursionError, OverflowError) as exc:
        raise Broken(f"not a message ({type(exc).__name__}: {str(exc)[:100]})") from None


def text(exc):
    try:
        return str(exc)[:300]
    except BaseException:
        return ""


def line(exc, filename, source):
    '''The last line of `filename` the traceback passes through, stripped (as extract_tb).'''
    found, tb = "", exc.__traceback__
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    while tb is not None:
        number = tb.tb_lineno or 0
        if tb.tb_frame.f_code.co_filename == filename and 0 < number <= len(lines):
            found = lines[number - 1].strip()
        tb = tb.tb_next
    return found
"""


# The answer's process: it holds the untrusted code, two pipe ends to the tests' process and
# nothing else (no verdict pipe, no secret, no tests). Its code runs only after the tests' process
# says it is ready (so, without a uid of its own, after that process made itself non-dumpable).
_ANSWER = _WIRE + r"""
MUTABLE = (list, dict, set, bytearray)
OPERATIONS = {
    "call": lambda target, args, kwargs: target(*args, **kwargs),
    "getattr": getattr, "setattr": setattr, "getitem": lambda target, key: target[key],
    "iter": iter, "next": next, "len": len, "bool": bool, "str": str, "repr": repr,
}


def answer(request, response):
    '''Run the answer's code, then serve the tests' requests on its objects until they end.'''
    sources = marshal.loads(sys.stdin.buffer.read())  # from the parent, not from the tests
    objects, numbers = [], {}

    def handle(value):
        number = numbers.get(id(value))
        if number is None:
            number = numbers[id(value)] = len(objects)
            objects.append(value)
        return number

    def held(value):  # as data, else (nested too deeply, a conversion raised) as a handle
        try:
            return encode(value, handle)
        except Exception:
            return b"r%d;" % handle(value)

    receive(request, objects.__getitem__)  # the tests are ready
    scope = {"__name__": "solution", "__builtins__": builtins}
    for stage in ("guard.py", "solution.py"):
        try:
            exec(compile(sources[stage], stage, "exec"), scope)
        except BaseException as exc:
            send(response, encode(["error", stage, type(exc).__name__, text(exc),
                                   line(exc, stage, sources[stage])], handle))
            return 1
    send(response, listed(b"s5:names", listed(*[listed(encode(name, handle), held(value))
                                                 for name, value in list(scope.items())
                                                 if not (name.startswith("__") and name.endswith("__"))])))
    while True:
        operation, target, *args = receive(request, objects.__getitem__)
        try:
            parts = [b"s1:v", held(OPERATIONS[operation](target, *args))]
            if operation == "call":  # what it did to its arguments, for the tests' own copies
                parts.append(held([arg for arg in [*args[0], *args[1].values()] if type(arg) in MUTABLE]))
            reply = listed(*parts)
        except BaseException as exc:
            reply = encode(["e", type(exc).__name__, text(exc)], handle)
        send(response, reply)


status = 0
try:
    status = answer(int(sys.argv[1]), int(sys.argv[2]))
except Broken:
    pass  # the tests are done with it
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except BaseException:
        pass
os._exit(status)
"""


# The tests' process: it runs the tests on the answer's names, reaching the answer's objects only
# through Remote handles, and writes the one report the parent trusts, with the secret.
_JUDGE = _WIRE + r"""
BROKEN = []
MUTABLE = (list, dict, set, bytearray)


class AnswerError(Exception):
    '''An exception the answer raised that has no builtin namesake.'''


class Remote:
    '''An object of the answer's: each use is a request to its process, except equality and
    hashing, which are by identity and decided here: the answer never sees what it is compared
    with.'''

    __slots__ = ("_number",)

    def __init__(self, number):
        object.__setattr__(self, "_number", number)

    def __eq__(self, other):
        return other._number == self._number if type(other) is Remote else NotImplemented

    def __hash__(self):
        return hash((Remote, self._number))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __getattr__(self, name):
        if name == "_number":
            raise AttributeError(name)
        return ask("getattr", self, name)

    def __setattr__(self, name, value):
        ask("setattr", self, name, value)

    def __call__(self, *args, **kwargs):
        return ask("call", self, list(args), kwargs)

    def __getitem__(self, key):
        return ask("getitem", self, key)

    def __iter__(self):
        return ask("iter", self)

    def __next__(self):
        return ask("next", self)

    def __len__(self):
        return ask("len", self)

    def __bool__(self):
        return ask("bool", self)

    def __str__(self):
        return ask("str", self)

    def __repr__(self):
        return ask("repr", self)


def share(value):
    if type(value) is Remote:
        return value._number
    raise TypeError(f"the tests pass the answer a {type(value).__name__}: only plain data and "
                    "the answer's own objects cross to its process")


def answer_error(name, message, iterating):
    '''The builtin exception `name`, else an AnswerError of that name. Only next() may stop an
    iteration: a StopIteration from a call would end a map() or all() of the tests unseen.'''
    kind = getattr(builtins, name, None)
    if name == "StopIteration" and not iterating:
        kind = None
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(message)
        except Exception:
            pass
    return type(name if name.isidentifier() else "AnswerError", (AnswerError,), {})(message)


def exchange(request):
    if BROKEN:
        raise Broken(BROKEN[0])
    try:
        send(REQUEST, encode(request, share))
        return receive(RESPONSE, Remote)
    except Broken as exc:
        BROKEN.append(str(exc))
        raise


def is_list(value, length, kinds):
    return type(value) is list and len(value) == length and all(
        type(part) is kind for part, kind in zip(value, kinds))


def write_back(mutable, changed):
    '''What the call did to its list, dict, set or bytearray arguments, done to the tests' own
    (only data, and only what the answer could have done to them in one process).'''
    if type(changed) is not list or len(changed) != len(mutable):
        return
    for old, new in zip(mutable, changed):
        if type(new) is type(old) and old != new:  # unchanged ones keep what they hold
            if type(old) is list or type(old) is bytearray:
                old[:] = new
            else:
                old.clear()
                old.update(new)


def ask(operation, *args):
    reply = exchange([operation, *args])
    if is_list(reply, 2, (str,)) and reply[0] == "v" and operation != "call":
        return reply[1]
    if is_list(reply, 3, (str,)) and reply[0] == "v" and operation == "call":
        write_back([arg for arg in [*args[1], *args[2].values()] if type(arg) in MUTABLE], reply[2])
        return reply[1]
    if is_list(reply, 3, (str, str, str)) and reply[0] == "e":
        raise answer_error(reply[1], reply[2], iterating=operation == "next")
    BROKEN.append("a reply that is not one")
    raise Broken(BROKEN[0])


def judge(tests, guard):
    '''Run the tests on the answer's names; the report: passed, or why not.'''
    if guard:
        exec(compile(guard, "guard.py", "exec"), {"__builtins__": builtins})
    try:
        reply = exchange(["load"])
    except Broken as exc:
        return {"broken": str(exc), "stage": "solution.py"}
    if is_list(reply, 5, (str, str, str, str, str)) and reply[0] == "error":
        stage = reply[1] if reply[1] in ("guard.py", "solution.py") else "solution.py"
        return {"stage": stage, "error": reply[2][:100], "message": reply[3][:300],
                "line": reply[4][:300]}
    if not (is_list(reply, 2, (str, list)) and reply[0] == "names"
            and all(is_list(pair, 2, (str,)) for pair in reply[1])):
        return {"broken": "a reply that is not one", "stage": "solution.py"}
    scope = {"__name__": "solution", "__builtins__": builtins}
    for name, value in reply[1]:
        # The answer's names never replace a builtin the tests use (no `def abs(x): return 0`).
        if name.isidentifier() and not name.startswith("__") and not hasattr(builtins, name):
            scope[name] = value
    try:
        exec(compile(tests, "tests.py", "exec"), scope)
    except BaseException as exc:
        if BROKEN:
            return {"broken": BROKEN[0], "stage": "tests.py"}
        return {"stage": "tests.py", "error": type(exc).__name__, "message": text(exc),
                "line": line(exc, "tests.py", tests)}
    if BROKEN:  # the tests caught it: a pass needs every answer the tests asked for
        return {"broken": BROKEN[0], "stage": "tests.py"}
    return {"passed": True}


verdict, REQUEST, RESPONSE = (int(arg) for arg in sys.argv[1:4])
given = marshal.loads(sys.stdin.buffer.read())
if given["private"]:  # no uid of its own: same-uid code must not trace it or open /proc/<pid>/
    import ctypes
    if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")
report = judge(given["tests"], given["guard"])
report["secret"] = given["secret"]
data = repr(report).encode()  # str and bool values only: ast.literal_eval reads it
while data:
    data = data[os.write(verdict, data):]
os._exit(0)
"""


# Used only where no network namespace can be made: weaker (ctypes or a subprocess get around it).
_SOCKET_GUARD = """\
import socket as _qg_socket
def _qg_no_network(*args, **kwargs):
    raise PermissionError("network access is disabled in the sandbox")
_qg_socket.socket = _qg_socket.create_connection = _qg_socket.socketpair = _qg_no_network
del _qg_socket, _qg_no_network
"""


# A child reads its program from stdin, compiled (length, then marshal): compiling it there
# would cost each process of each run milliseconds. Only this process writes that part.
_BOOT = ("import marshal, sys; "
         "exec(marshal.loads(sys.stdin.buffer.read(int.from_bytes(sys.stdin.buffer.read(4), 'big'))))")


_COMPILE = ("import marshal, sys; "
            "sys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.read(), sys.argv[1], 'exec')))")


@functools.cache
def _compiled(interpreter: str, program: str, name: str) -> bytes:
    """`program` compiled by the sandbox's interpreter (marshal is per version), framed for _BOOT."""
    done = subprocess.run([interpreter, "-I", "-S", "-c", _COMPILE, name], input=program.encode(),
                          capture_output=True, timeout=60, check=True)
    return len(done.stdout).to_bytes(4, "big") + done.stdout
