;; csvstats: a WASI command that reads /input/data.csv and writes /output/stats.txt with
;; its byte, line and field counts. Built to a .wasm with wasmtime.wat2wasm (the demo does it).
;; Preopened directories: fd 3 = /input (read-only), fd 4 = /output.
(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $fd_close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "data.csv")
  (data (i32.const 32) "stats.txt")
  (data (i32.const 200) "bytes=")
  (data (i32.const 210) "lines=")
  (data (i32.const 220) "fields=")
  ;; 64: fd out-param; 72: iovec (ptr, len); 80: byte count
  ;; 300..: the text written; 400..420: digits, reversed; 1024..5120: read buffer

  ;; copy $len bytes from $src to $dst, return $dst + $len
  (func $copy (param $dst i32) (param $src i32) (param $len i32) (result i32)
    (local $i i32)
    (block $end (loop $next
      (br_if $end (i32.ge_u (local.get $i) (local.get $len)))
      (i32.store8 (i32.add (local.get $dst) (local.get $i))
                  (i32.load8_u (i32.add (local.get $src) (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (i32.add (local.get $dst) (local.get $len)))

  ;; write $v in decimal at $dst followed by a newline, return the position after it
  (func $number (param $dst i32) (param $v i32) (result i32)
    (local $n i32)
    (loop $digit
      (i32.store8 (i32.add (i32.const 400) (local.get $n))
                  (i32.add (i32.const 48) (i32.rem_u (local.get $v) (i32.const 10))))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      (local.set $v (i32.div_u (local.get $v) (i32.const 10)))
      (br_if $digit (i32.ne (local.get $v) (i32.const 0))))
    (block $end (loop $next
      (br_if $end (i32.eqz (local.get $n)))
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (i32.store8 (local.get $dst) (i32.load8_u (i32.add (i32.const 400) (local.get $n))))
      (local.set $dst (i32.add (local.get $dst) (i32.const 1)))
      (br $next)))
    (i32.store8 (local.get $dst) (i32.const 10))
    (i32.add (local.get $dst) (i32.const 1)))

  (func (export "_start")
    (local $in i32) (local $out i32) (local $n i32) (local $i i32) (local $c i32)
    (local $bytes i32) (local $lines i32) (local $fields i32) (local $end i32)
    (if (call $path_open (i32.const 3) (i32.const 0) (i32.const 16) (i32.const 8) (i32.const 0)
                         (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 64))
      (then (call $proc_exit (i32.const 10))))
    (local.set $in (i32.load (i32.const 64)))
    (block $eof (loop $read
      (i32.store (i32.const 72) (i32.const 1024))
      (i32.store (i32.const 76) (i32.const 4096))
      (if (call $fd_read (local.get $in) (i32.const 72) (i32.const 1) (i32.const 80))
        (then (call $proc_exit (i32.const 12))))
      (local.set $n (i32.load (i32.const 80)))
      (br_if $eof (i32.eqz (local.get $n)))
      (local.set $bytes (i32.add (local.get $bytes) (local.get $n)))
      (local.set $i (i32.const 0))
      (block $done (loop $scan
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $c (i32.load8_u (i32.add (i32.const 1024) (local.get $i))))
        (if (i32.eq (local.get $c) (i32.const 10))
          (then (local.set $lines (i32.add (local.get $lines) (i32.const 1)))
                (local.set $fields (i32.add (local.get $fields) (i32.const 1)))))
        (if (i32.eq (local.get $c) (i32.const 44))
          (then (local.set $fields (i32.add (local.get $fields) (i32.const 1)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $scan)))
      (br $read)))
    (local.set $end (call $copy (i32.const 300) (i32.const 200) (i32.const 6)))
    (local.set $end (call $number (local.get $end) (local.get $bytes)))
    (local.set $end (call $copy (local.get $end) (i32.const 210) (i32.const 6)))
    (local.set $end (call $number (local.get $end) (local.get $lines)))
    (local.set $end (call $copy (local.get $end) (i32.const 220) (i32.const 7)))
    (local.set $end (call $number (local.get $end) (local.get $fields)))
    (if (call $path_open (i32.const 4) (i32.const 0) (i32.const 32) (i32.const 9) (i32.const 9)
                         (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 64))
      (then (call $proc_exit (i32.const 11))))
    (local.set $out (i32.load (i32.const 64)))
    (i32.store (i32.const 72) (i32.const 300))
    (i32.store (i32.const 76) (i32.sub (local.get $end) (i32.const 300)))
    (if (call $fd_write (local.get $out) (i32.const 72) (i32.const 1) (i32.const 80))
      (then (call $proc_exit (i32.const 13))))
    (drop (call $fd_close (local.get $out)))
    ;; the same text on stdout, for the job's log
    (drop (call $fd_write (i32.const 1) (i32.const 72) (i32.const 1) (i32.const 80)))))
