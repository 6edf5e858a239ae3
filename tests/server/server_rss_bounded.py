#!/usr/bin/env python3
"""`serve`'s memory under large request bodies (issue 49): after each request, whatever its
transfer encoding and whether it was answered or refused (413 over --max-body-bytes, 400 past the
context), RSS is back within 2x --max-body-bytes of idle. (Without one malloc arena and a trim
after large bodies it climbed ~15 MiB per 8 MB request and stayed.) Prints each request's peak.

usage: server_rss_bounded.py COLOCATED_RL
"""
import json
import re
import socket
import subprocess
import sys
import threading
import time

MB = 1 << 20
MAX_BODY = 8 * MB  # serve's default --max-body-bytes


def main():
    exe = sys.argv[1]
    srv = subprocess.Popen([exe, "serve", "--port", "0"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    line = ""
    while not line.startswith("listening on"):
        line = srv.stdout.readline()
        if not line and srv.poll() is not None:
            sys.exit("serve exited before listening")
    port = int(re.search(r":(\d+)\s*$", line).group(1))
    threading.Thread(target=lambda: [None for _ in srv.stdout], daemon=True).start()

    def rss_mib():
        with open(f"/proc/{srv.pid}/status") as f:
            for l in f:
                if l.startswith("VmRSS"):
                    return int(l.split()[1]) / 1024
        return 0.0

    def request(raw):
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(60)
        try:
            s.sendall(raw)
        except OSError:
            pass  # refused mid-body: the answer is still there to read
        out = b""
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    break
                out += d
        except OSError:
            pass
        s.close()
        return out.split(b"\r\n", 1)[0].decode(errors="replace")

    def prompt(n):
        words = "copy the red box and the big dog "
        return json.dumps({"prompt": (words * (n // len(words) + 1))[:n],
                           "max_tokens": 2}).encode()

    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\n")

    def with_length(b):
        return head + b"Content-Length: %d\r\n\r\n" % len(b) + b

    def chunked(b, piece=1 << 16):
        out = head + b"Transfer-Encoding: chunked\r\n\r\n"
        for i in range(0, len(b), piece):
            c = b[i:i + piece]
            out += b"%x\r\n" % len(c) + c + b"\r\n"
        return out + b"0\r\n\r\n"

    # Let the model load, serve a few small requests, then take the idle figure.
    deadline = time.time() + 120
    while "200" not in request(with_length(prompt(100))):
        if time.time() > deadline:
            sys.exit("serve never answered a small request")
        time.sleep(0.5)
    for _ in range(3):
        request(with_length(prompt(100)))
    time.sleep(0.5)
    idle = rss_mib()
    print(f"idle RSS {idle:.0f} MiB; bound after each request: +{2 * MAX_BODY / MB:.0f} MiB")

    peak = [0.0]
    sampling = [True]

    def sample():
        while sampling[0]:
            peak[0] = max(peak[0], rss_mib())
            time.sleep(0.005)

    threading.Thread(target=sample, daemon=True).start()

    def concurrent(raw, n):
        out = []
        ts = [threading.Thread(target=lambda: out.append(request(raw))) for _ in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return ", ".join(sorted(set(out)))

    big = prompt(MAX_BODY - 100)
    probes = [
        ("8 MiB prompt, Content-Length", "400", lambda: request(with_length(big))),
        ("8 MiB prompt, chunked", "400", lambda: request(chunked(big))),
        ("8 MiB prompt, chunked again", "400", lambda: request(chunked(big))),
        ("40 MiB chunked body", "413", lambda: request(chunked(prompt(40 * MB)))),
        ("50 MiB Content-Length body", "413", lambda: request(with_length(prompt(50 * MB)))),
        ("4 concurrent 7.9 MB prompts", "400",
         lambda: concurrent(with_length(prompt(int(7.9 * MB))), 4)),
        ("8 MiB prompt, Content-Length again", "400", lambda: request(with_length(big))),
    ]
    failed = []
    for name, want, run in probes:
        peak[0] = 0.0
        status = run()
        time.sleep(0.3)
        after = rss_mib() - idle
        ok = want in status and after <= 2 * MAX_BODY / MB
        print(f"{name:36s} {status:32s} after +{after:5.0f} MiB  peak +{peak[0] - idle:5.0f} MiB"
              f"  {'ok' if ok else 'FAIL'}")
        if not ok:
            failed.append(name)
    sampling[0] = False
    srv.terminate()
    srv.wait(timeout=30)
    if failed:
        sys.exit("over the bound or a wrong status: " + "; ".join(failed))


if __name__ == "__main__":
    main()
