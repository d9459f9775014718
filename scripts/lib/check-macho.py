#!/usr/bin/env python3
"""Checks macOS executables built on Linux (scripts/test, infra/runner/build-release) without a Mac.

Usage: check-macho.py MIN_MACOS FILE...

Each FILE must be a 64-bit Mach-O executable for the architecture its path names (aarch64 or
x86_64), whose LC_BUILD_VERSION says platform macOS and a minimum no newer than MIN_MACOS, that
loads only libraries every Mac has (under /usr/lib/ or /System/Library/), and, for arm64, carries
a code signature (macOS on Apple silicon kills unsigned executables; the linker's ad-hoc signature
suffices). Prints one line per file; exits 1 at the first problem.
"""
import struct
import sys

CPU = {0x0100000C: "aarch64", 0x01000007: "x86_64"}
LC_LOAD_DYLIB, LC_CODE_SIGNATURE, LC_BUILD_VERSION = 0xC, 0x1D, 0x32
PLATFORM_MACOS = 1


def version(packed):
    return (packed >> 16, (packed >> 8) & 0xFF)


def check(path, floor):
    data = open(path, "rb").read()
    magic, cpu, _sub, filetype, ncmds = struct.unpack_from("<IiiII", data)
    if magic != 0xFEEDFACF:
        return f"not a 64-bit little-endian Mach-O file (magic {magic:#x})"
    if filetype != 2:
        return f"not an executable (file type {filetype})"
    arch = CPU.get(cpu & 0xFFFFFFFF, hex(cpu))
    if arch not in path:
        return f"built for {arch}, which its path does not name"
    offset, dylibs, signed, minos = 32, [], False, None
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, offset)
        if cmd == LC_LOAD_DYLIB:
            (name_at,) = struct.unpack_from("<I", data, offset + 8)
            dylibs.append(data[offset + name_at : offset + size].split(b"\0")[0].decode())
        elif cmd == LC_CODE_SIGNATURE:
            signed = True
        elif cmd == LC_BUILD_VERSION:
            platform, packed, _sdk = struct.unpack_from("<III", data, offset + 8)
            if platform != PLATFORM_MACOS:
                return f"platform {platform}, not macOS"
            minos = version(packed)
        offset += size
    if minos is None:
        return "no LC_BUILD_VERSION"
    if minos > floor:
        return f"needs macOS {minos[0]}.{minos[1]}, newer than {floor[0]}.{floor[1]}"
    foreign = [d for d in dylibs if not d.startswith(("/usr/lib/", "/System/Library/"))]
    if foreign:
        return f"loads libraries a Mac may not have: {foreign}"
    if arch == "aarch64" and not signed:
        return "no code signature (Apple silicon refuses to run it)"
    print(f"{path}: Mach-O {arch} executable, macOS {minos[0]}.{minos[1]}+, "
          f"{'signed (ad hoc), ' if signed else ''}loads {', '.join(dylibs)}")
    return None


def main():
    floor = tuple(int(p) for p in sys.argv[1].split(".")[:2])
    for path in sys.argv[2:]:
        problem = check(path, floor)
        if problem:
            print(f"{path}: {problem}", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
