"""The package's mirror of include/flashattn.h (flashattn._native: its ctypes structs, enum
values and function signatures) checked against the header itself.

Why a check and not generated classes: the header says what the C compiler lays out, so the
numbers come from the compiler, in a program built here against the header (offsetof and
sizeof of every field of every struct, sizeof of every struct, the value of every
enumerator); the names come from the header's text (every struct's fields in order, every
enum's enumerators), so that a field or enumerator the mirror lacks is caught even where it
would fit in padding. The ctypes classes stay written out in _native.py, readable beside the
code that fills them and with Python's names (pass_, the option strings of ALIGNS...);
generating them would need the compiler and the header wherever the package is built or
imported from a source tree, for classes no reader could see. This test runs where both are
(CI's pytest from a clone), on the package as installed.
"""
import ctypes
import os
import re
import shlex
import shutil
import subprocess

import pytest

from flashattn import _native as N

HEADER = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir,
                                       "include", "flashattn.h"))


def compiler():
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(shlex.split(cc)[0]):
            return shlex.split(cc)
    return None


def declarations(text):
    """The header's structs ({C type: [field, ...]} in order) and enums ({enum: [enumerator,
    ...]}), read from its text: declarations as the header writes them (one level of braces,
    `type a, *b, c[4];` fields)."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
    structs = {}
    for m in re.finditer(r"typedef\s+struct\s*\{([^{}]*)\}\s*(\w+)\s*;|"
                         r"struct\s+(\w+)\s*\{([^{}]*)\}\s*;", text):
        body, name = (m.group(1), m.group(2)) if m.group(2) else (m.group(4), m.group(3))
        fields = []
        for decl in body.split(";"):
            decl = re.sub(r"\[[^\]]*\]", "", decl)
            fields += [re.findall(r"\w+", part)[-1] for part in decl.split(",") if part.strip()]
        structs[name] = fields
    enums = {m.group(2): [re.match(r"\s*(\w+)", e).group(1) for e in m.group(1).split(",")
                          if e.strip()]
             for m in re.finditer(r"typedef\s+enum\s*\{([^{}]*)\}\s*(\w+)\s*;", text)}
    return structs, enums


def measured(structs, enums, tmp_path):
    """{("S", type): sizeof, ("F", type, field): (offset, size), ("E", enumerator): value}, as
    a program compiled against the header prints them."""
    cc = compiler()
    if cc is None:
        pytest.skip("no C compiler (CC, cc, gcc, clang)")
    lines = []
    for t, fields in structs.items():
        lines.append(f'printf("S {t} %zu\\n", sizeof({t}));')
        lines += [f'printf("F {t} {f} %zu %zu\\n", offsetof({t}, {f}), '
                  f'sizeof((({t} *)0)->{f}));' for f in fields]
    lines += [f'printf("E {e} %lld\\n", (long long){e});' for es in enums.values() for e in es]
    src = tmp_path / "abi.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"flashattn.h\"\n"
                   "int main(void)\n{\n    " + "\n    ".join(lines) + "\n    return 0;\n}\n")
    exe = tmp_path / "abi"
    subprocess.run(cc + ["-std=c11", "-I", os.path.dirname(HEADER), str(src), "-o", str(exe)],
                   check=True)
    out = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True,
                               text=True).stdout.splitlines():
        w = line.split()
        if w[0] == "F":
            out[tuple(w[:3])] = (int(w[3]), int(w[4]))
        else:
            out[tuple(w[:2])] = int(w[2])
    return out


def problems(structs, enums, m, native):
    """Every way the mirror in `native` (a module like flashattn._native) differs from the
    header's declarations and the numbers m, in words."""
    bad = []
    for t in structs.keys() - native.STRUCTS.keys():
        bad.append(f"{t}: a struct of the header with no mirror in STRUCTS")
    for t in native.STRUCTS.keys() - structs.keys():
        bad.append(f"{t}: mirrored in STRUCTS, but the header has no such struct")
    for t, cls in native.STRUCTS.items():
        if t not in structs:
            continue
        names = [f[0] for f in cls._fields_]
        if [n.rstrip("_") for n in names] != structs[t]:
            bad.append(f"{t}: fields {structs[t]} in the header, {names} in {cls.__name__}")
            continue
        for n in names:
            c, py = m[("F", t, n.rstrip("_"))], getattr(cls, n)
            if c != (py.offset, py.size):
                bad.append(f"{t}.{n}: offset {c[0]}, size {c[1]} in C; {cls.__name__}.{n}: "
                           f"offset {py.offset}, size {py.size}")
        if m[("S", t)] != ctypes.sizeof(cls):
            bad.append(f"{t}: sizeof {m[('S', t)]} in C, {ctypes.sizeof(cls)} in "
                       f"{cls.__name__}")
    for t in enums.keys() - native.ENUMS.keys():
        bad.append(f"{t}: an enum of the header with no mirror in ENUMS")
    for t, (table, prefix) in native.ENUMS.items():
        if t not in enums:
            bad.append(f"{t}: mirrored in ENUMS, but the header has no such enum")
            continue
        where = getattr(native, table) if table else None
        for e in enums[t]:
            tail = e[len(prefix):] if e.startswith(prefix) else None
            key = tail if where is None else tail and tail.lower().replace("_", "-")
            value = getattr(native, key, None) if where is None else where.get(key)
            if tail is None or value != m[("E", e)]:
                bad.append(f"{t}: {e} = {m[('E', e)]}; the mirror's "
                           f"{table + '[' + repr(key) + ']' if table else key} is {value!r}")
        if where is not None and len(where) != len(enums[t]):
            bad.append(f"{t}: {len(enums[t])} enumerators, {len(where)} names in {table}")
    return bad


def signatures(text):
    """{function: (returns a pointer, [each parameter is a pointer])} of the FA_API
    declarations."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    out = {}
    for m in re.finditer(r"FA_API\s+([^;(]*?)(\w+)\s*\(([^)]*)\)\s*;", text):
        params = [p for p in m.group(3).split(",") if p.strip() not in ("", "void")]
        out[m.group(2)] = ("*" in m.group(1), ["*" in p for p in params])
    return out


def pointer_like(t):
    """A ctypes type that passes a pointer (None: a function that returns nothing)."""
    return t is not None and (t in (ctypes.c_void_p, ctypes.c_char_p)
                              or issubclass(t, (ctypes._Pointer, ctypes.Array)))


@pytest.fixture(scope="module")
def header():
    if not os.path.exists(HEADER):
        pytest.skip(f"no {HEADER}: the package's tests outside its source tree")
    with open(HEADER) as f:
        return f.read()


@pytest.fixture(scope="module")
def numbers(header, tmp_path_factory):
    structs, enums = declarations(header)
    return structs, enums, measured(structs, enums, tmp_path_factory.mktemp("abi"))


def test_every_struct_and_enum_of_the_header_is_mirrored_exactly(numbers):
    structs, enums, m = numbers
    assert len(structs) >= 9 and len(enums) >= 12  # the reader found the declarations
    bad = problems(structs, enums, m, N)
    assert not bad, "\n".join(bad)


class Mirror:
    """A copy of the mirror's tables, to break."""

    def __init__(self, **changes):
        self.__dict__.update({k: getattr(N, k) for k in dir(N) if not k.startswith("__")})
        self.STRUCTS, self.ENUMS = dict(N.STRUCTS), dict(N.ENUMS)
        self.__dict__.update(changes)


def struct(name, fields):
    return type(name, (ctypes.Structure,), {"_fields_": fields})


@pytest.mark.parametrize("breakage, says", [
    ("swap", "fields"), ("drop", "fields"), ("type", "offset"), ("struct", "no mirror"),
    ("enum value", "FA_E4M3 = 5"), ("enum missing", "FA_ERR_DEVICE"), ("isa", "ISAS"),
])
def test_a_wrong_mirror_is_caught(numbers, breakage, says):
    """The check itself, on mirrors broken on purpose: two fields swapped, one dropped, one of
    another size (every offset after it moves), an enumerator's value changed or missing, a
    struct left out, a name the library's list lacks."""
    structs, enums, m = numbers
    f = list(N.Params._fields_)
    if breakage == "swap":
        f[1], f[2] = f[2], f[1]
        mirror = Mirror(STRUCTS={**N.STRUCTS, "fa_params": struct("Params", f)})
    elif breakage == "drop":
        mirror = Mirror(STRUCTS={**N.STRUCTS, "fa_params": struct("Params", f[:5] + f[6:])})
    elif breakage == "type":
        f[1] = ("causal", ctypes.c_int64)  # int in C
        mirror = Mirror(STRUCTS={**N.STRUCTS, "fa_params": struct("Params", f)})
    elif breakage == "struct":
        mirror = Mirror(STRUCTS={k: v for k, v in N.STRUCTS.items() if k != "fa_options"})
    elif breakage == "enum value":
        mirror = Mirror(E4M3=6)
    elif breakage == "enum missing":
        mirror = Mirror()
        del mirror.FA_ERR_DEVICE
    else:
        mirror = Mirror(ISAS={k: v for k, v in N.ISAS.items() if k != "amx"})
    found = problems(structs, enums, m, mirror)
    assert found and any(says in p for p in found), found


def test_a_field_the_mirror_lacks_is_caught_in_padding(numbers):
    """A field appended to fa_options would fit in its trailing padding (sizeof unchanged):
    the header's names catch it."""
    structs, enums, m = numbers
    grown = dict(structs, fa_options=structs["fa_options"] + ["priority"])
    found = problems(grown, enums, m, N)
    assert any("fa_options: fields" in p for p in found), found


def test_the_bound_functions_take_what_the_header_declares(header):
    """Each function the package binds (_native._sig): as many parameters as the header
    declares, pointers where it has pointers, and a pointer result where it returns one."""
    decl = signatures(header)
    bad = []
    for name, (res, args) in N._sig.items():
        if name not in decl:
            bad.append(f"{name}: not declared FA_API")
            continue
        ptr_res, ptr_args = decl[name]
        if pointer_like(res) != ptr_res or [pointer_like(a) for a in args] != ptr_args:
            bad.append(f"{name}: the header's pointers {ptr_res, ptr_args}, the package's "
                       f"{pointer_like(res), [pointer_like(a) for a in args]}")
    assert not bad, "\n".join(bad)
