"""The coded peer tier's arithmetic and memory, against what it replaces, in one run.

Throughput, one core (the codec is single-threaded per file; a node encodes its files in
parallel): encoding the checkpoint's bytes into rs(k,m) stripes (pyeclib, ISA-L; each stripe's
crc32c computed in the same pass, as the service does) and decoding them back, with every data
stripe there (the fragments are joined, no arithmetic) and with m data stripes lost (parity
decoded), each against a plain memcpy of the same bytes. The bytes are in memory and the stripes
go to sinks that drop them, so what is timed is the codec and its checksums, not a disk.

Memory: the bytes the holders keep per byte of checkpoint, rs(k,2) against `copies = 2`, the
two surviving the same two lost holders; computed from the stripe format (its headers and
padding included), not sampled.

Restore, from STACK_FROM bytes up (a stack of its own: erasure_restore): a lost node's files
restored by the client from k holders' stripes against the same restore from a holder's full
copy, and `TierpointReader` loading the state from stripes against from the full copy.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from typing import Any

from tierpoint_client.erasure import Code, stripe_size
from tierpoint_client.erasure.stripes import StripeSource, decode, encode, segment_sizes

from benchmarks.env import Env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.erasure_restore import CodedRestore

MiB = 1024 * 1024
CODES = (Code(8, 2), Code(4, 2))
# Runs of at least this many bytes measure the restore rows too, on a stack of their own (seven
# node workers, the torch venv): the CI smoke's tiny run measures the codec alone.
STACK_FROM = 64 * MiB


class _Drop(io.RawIOBase):
    """A sink that takes bytes and keeps none."""

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return len(b)


def _timed(fn: Callable[[], None]) -> Outcome:
    cpu0, t0 = time.process_time(), time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    return Outcome({"seconds": seconds}, cpu={"codec": time.process_time() - cpu0})


class Erasure(Scenario):
    name = "erasure"
    summary = "rs(k,m) encode/decode per core against memcpy; holder memory against copies = 2"

    def __init__(self, mib: int, env: Env | None = None) -> None:
        self.nbytes = mib * MiB
        self.restore = (
            CodedRestore(env, env.work / "erasure", mib)
            if env is not None and self.nbytes >= STACK_FROM
            else None
        )
        self.data = b""
        self.stripes: dict[Code, list[bytes]] = {}
        self.crc = ""

    def params(self) -> dict[str, Any]:
        found = {"mib": self.nbytes // MiB, "codes": [str(c) for c in CODES], "threads": 1}
        return found | (self.restore.params() if self.restore is not None else {})

    def watched(self) -> Watched:
        return self.restore.watched() if self.restore is not None else {}

    def prepare(self) -> list[Method]:
        import crc32c

        self.data = os.urandom(self.nbytes)
        self.crc = f"{crc32c.crc32c(self.data):08x}"
        methods = [Method("memcpy", self._memcpy, (Row("memcpy", nbytes=self.nbytes),))]
        for code in CODES:
            sinks = [io.BytesIO() for _ in range(code.width)]
            infos = encode(code, io.BytesIO(self.data), self.nbytes, sinks)
            self.stripes[code] = [s.getvalue() for s in sinks]
            crcs = [i.crc32c for i in infos]
            lost_data = list(range(code.m, code.k)) + list(range(code.k, code.width))
            for label, run in (
                (f"encode {code}", self._encoder(code)),
                (f"decode {code}, all data stripes", self._decoder(code, range(code.k), crcs)),
                (
                    f"decode {code}, {code.m} data stripes lost",
                    self._decoder(code, lost_data, crcs),
                ),
            ):
                methods.append(
                    Method(label, run, (Row(label, baseline="memcpy", nbytes=self.nbytes),))
                )
        methods.append(self._memory())
        if self.restore is not None:
            methods += self.restore.prepare()
        return methods

    def _memcpy(self) -> Outcome:
        out = bytearray(self.nbytes)

        def copy() -> None:
            # The same segment walk as the codec, so both touch the bytes in the same pieces.
            at = 0
            for n in segment_sizes(self.nbytes):
                out[at : at + n] = self.data[at : at + n]
                at += n

        return _timed(copy)

    def _encoder(self, code: Code) -> Callable[[], Outcome]:
        def run() -> Outcome:
            sinks = [_Drop() for _ in range(code.width)]
            return _timed(lambda: encode(code, io.BytesIO(self.data), self.nbytes, sinks))  # type: ignore[arg-type]

        return run

    def _decoder(self, code: Code, use: Any, crcs: list[str]) -> Callable[[], Outcome]:
        indexes = list(use)

        def run() -> Outcome:
            sources = {
                i: StripeSource(i, io.BytesIO(self.stripes[code][i]), crcs[i]) for i in indexes
            }
            return _timed(lambda: decode(code, self.nbytes, self.crc, sources, _Drop()))  # type: ignore[arg-type]

        return run

    def _memory(self) -> Method:
        rows = [Row("holders' bytes per checkpoint byte: copies = 2", metric="copies", unit="n")]
        for code in (Code(8, 2), Code(4, 2)):
            rows.append(
                Row(
                    f"holders' bytes per checkpoint byte: {code}",
                    metric=str(code),
                    unit="n",
                    baseline=rows[0].label,
                )
            )

        def run() -> Outcome:
            metrics = {"copies": 2.0}
            for code in (Code(8, 2), Code(4, 2)):
                metrics[str(code)] = code.width * stripe_size(code, self.nbytes) / self.nbytes
            return Outcome(metrics)

        return Method("holder memory", run, tuple(rows))

    def close(self) -> None:
        self.data = b""
        self.stripes.clear()
        if self.restore is not None:
            self.restore.close()
