"""A client that sends one large filter body back to back on several connections, run as its
own process by test_fairness (so that its JSON work does not share the server's GIL).

    python tests/http/large_client.py PORT BODY_FILE CONNECTIONS SECONDS

Prints one JSON line: per request latency, and whether every answer was right: the first is
decoded and checked (200, no Error, the passing Nodes echoed), the others must equal it byte
for byte (the cluster does not change meanwhile).
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time


def main() -> None:
    port, path, connections, seconds = (
        int(sys.argv[1]),
        sys.argv[2],
        int(sys.argv[3]),
        float(sys.argv[4]),
    )
    with open(path, "rb") as f:
        body = f.read()
    expected_items = int(sys.argv[5])
    first: list[bytes] = []
    latencies: list[float] = []
    wrong: list[str] = []
    lock = threading.Lock()
    print("ready", flush=True)
    sys.stdin.readline()  # go
    deadline = time.monotonic() + seconds

    def run() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < deadline:
            started = time.monotonic()
            conn.request("POST", "/filter", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            answer = resp.read()
            took = time.monotonic() - started
            with lock:
                latencies.append(took)
                if resp.status != 200:
                    wrong.append(f"status {resp.status}: {answer[:200]!r}")
                elif not first:
                    doc = json.loads(answer)
                    items = (doc.get("Nodes") or {}).get("items") or []
                    if doc.get("Error") or len(items) != expected_items:
                        wrong.append(f"answer: Error={doc.get('Error')!r}, {len(items)} nodes")
                    first.append(answer)
                elif answer != first[0]:
                    wrong.append("answer differs from the first")
        conn.close()

    threads = [threading.Thread(target=run) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"latencies": latencies, "wrong": wrong}), flush=True)


if __name__ == "__main__":
    main()
