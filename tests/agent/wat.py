"""WASI test modules, written in WAT and compiled with ``wasmtime.wat2wasm`` by the tests.

Preopened directories are file descriptors 3 (/input) and 4 (/output): the WASM executor opens
/input first. Rights: FD_READ = 2, FD_WRITE = 64; oflags: CREAT = 1, TRUNC = 8.
"""

from __future__ import annotations

from pathlib import Path

import wasmtime

_WASI = """
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $fd_close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
"""

# Reads /input/data.txt, writes it upper-cased to /output/upper.txt, prints "ok" on stdout.
UPPERCASE = f"""
(module
  {_WASI}
  (memory (export "memory") 1)
  (data (i32.const 16) "data.txt")
  (data (i32.const 32) "upper.txt")
  (data (i32.const 48) "ok\\n")
  ;; 64: fd out-param; 72: iovec (ptr, len); 80: byte count; 1024..5120: buffer
  (func $upper (param $n i32) (local $i i32) (local $c i32)
    (block $end (loop $next
      (br_if $end (i32.ge_u (local.get $i) (local.get $n)))
      (local.set $c (i32.load8_u (i32.add (i32.const 1024) (local.get $i))))
      (if (i32.and (i32.ge_u (local.get $c) (i32.const 97))
                   (i32.le_u (local.get $c) (i32.const 122)))
        (then (i32.store8 (i32.add (i32.const 1024) (local.get $i))
                          (i32.sub (local.get $c) (i32.const 32)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next))))
  (func (export "_start") (local $in i32) (local $out i32) (local $n i32)
    (if (call $path_open (i32.const 3) (i32.const 0) (i32.const 16) (i32.const 8) (i32.const 0)
                         (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 64))
      (then (call $proc_exit (i32.const 10))))
    (local.set $in (i32.load (i32.const 64)))
    (if (call $path_open (i32.const 4) (i32.const 0) (i32.const 32) (i32.const 9) (i32.const 9)
                         (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 64))
      (then (call $proc_exit (i32.const 11))))
    (local.set $out (i32.load (i32.const 64)))
    (block $eof (loop $copy
      (i32.store (i32.const 72) (i32.const 1024))
      (i32.store (i32.const 76) (i32.const 4096))
      (if (call $fd_read (local.get $in) (i32.const 72) (i32.const 1) (i32.const 80))
        (then (call $proc_exit (i32.const 12))))
      (local.set $n (i32.load (i32.const 80)))
      (br_if $eof (i32.eqz (local.get $n)))
      (call $upper (local.get $n))
      (i32.store (i32.const 76) (local.get $n))
      (if (call $fd_write (local.get $out) (i32.const 72) (i32.const 1) (i32.const 80))
        (then (call $proc_exit (i32.const 13))))
      (br $copy)))
    (drop (call $fd_close (local.get $out)))
    (i32.store (i32.const 72) (i32.const 48))
    (i32.store (i32.const 76) (i32.const 3))
    (drop (call $fd_write (i32.const 1) (i32.const 72) (i32.const 1) (i32.const 80)))))
"""

INFINITE_LOOP = """
(module (func (export "_start") (loop $forever (br $forever))))
"""

# Grows its memory 1 MiB at a time until refused, then traps.
MEMORY_BOMB = """
(module
  (memory (export "memory") 1)
  (func (export "_start")
    (loop $grow (br_if $grow (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
    unreachable))
"""

# Asks for 1 GiB of memory up front.
HUGE_MEMORY = """
(module (memory (export "memory") 16384) (func (export "_start")))
"""

# Tries to leave its preopens; prints "." per refused attempt, "X" per success.
ESCAPE = f"""
(module
  {_WASI}
  (memory (export "memory") 1)
  (data (i32.const 100) "../../../../../../etc/passwd")  ;; 28
  (data (i32.const 140) "/etc/passwd")                   ;; 11
  (data (i32.const 160) "leak")                          ;; 4: a symlink to a host file
  (data (i32.const 170) "new.txt")                       ;; 7: create in read-only /input
  (data (i32.const 180) "../escaped.txt")                ;; 14: create beside /output
  (data (i32.const 200) "data.txt")                      ;; 8: write into an input file
  (data (i32.const 16) ".X")
  (func $report (param $failed i32)
    (i32.store (i32.const 72) (select (i32.const 16) (i32.const 17) (local.get $failed)))
    (i32.store (i32.const 76) (i32.const 1))
    (drop (call $fd_write (i32.const 1) (i32.const 72) (i32.const 1) (i32.const 80))))
  (func $try (param $dir i32) (param $path i32) (param $len i32)
             (param $oflags i32) (param $rights i64)
    (call $report (call $path_open (local.get $dir) (i32.const 0) (local.get $path) (local.get $len)
                                   (local.get $oflags) (local.get $rights) (i64.const 0)
                                   (i32.const 0) (i32.const 64))))
  (func (export "_start")
    (call $try (i32.const 3) (i32.const 100) (i32.const 28) (i32.const 0) (i64.const 2))
    (call $try (i32.const 3) (i32.const 140) (i32.const 11) (i32.const 0) (i64.const 2))
    (call $try (i32.const 3) (i32.const 160) (i32.const 4) (i32.const 0) (i64.const 2))
    (call $try (i32.const 3) (i32.const 170) (i32.const 7) (i32.const 1) (i64.const 64))
    (call $try (i32.const 4) (i32.const 180) (i32.const 14) (i32.const 1) (i64.const 64))
    (call $try (i32.const 3) (i32.const 200) (i32.const 8) (i32.const 0) (i64.const 64))))
"""

# Writes 64 KiB blocks to /output/fill until the file system or the cap stops it.
DISK_FILL = f"""
(module
  {_WASI}
  (memory (export "memory") 2)
  (data (i32.const 32) "fill")
  (func (export "_start") (local $fd i32)
    (if (call $path_open (i32.const 4) (i32.const 0) (i32.const 32) (i32.const 4) (i32.const 9)
                         (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 64))
      (then (call $proc_exit (i32.const 11))))
    (local.set $fd (i32.load (i32.const 64)))
    (i32.store (i32.const 72) (i32.const 65536))
    (i32.store (i32.const 76) (i32.const 65536))
    (loop $more
      (br_if $more (i32.eqz (call $fd_write (local.get $fd) (i32.const 72) (i32.const 1)
                                             (i32.const 80)))))
    (call $proc_exit (i32.const 28))))
"""


def build(wat: str, path: Path) -> Path:
    """Compile ``wat`` to a ``.wasm`` file at ``path``."""
    path.write_bytes(wasmtime.wat2wasm(wat))
    return path
