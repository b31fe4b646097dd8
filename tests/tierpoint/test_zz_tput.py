import os, socket, statistics, time
from tierpoint.config import Settings
from tests.tierpoint.test_data_endpoint_reads import NODE, SECRET, verified
from tests.helpers.lifecycle import ShardSpec, crc_hex, seed_checkpoint
from tierpoint.services.data_endpoint import serve

def test_tput(settings, sessions):
    settings = Settings.model_validate({**settings.model_dump(), "data_token": SECRET})
    size = 512 * 1024 * 1024
    data = os.urandom(size)
    job = "tput-" + os.urandom(4).hex()
    cp = seed_checkpoint(settings, sessions, job, 1, [ShardSpec(NODE, "f.bin", data, crc_hex(data))])
    verified(sessions, cp.checkpoint_id, ["f.bin"])
    srv = serve(settings, sessions, NODE, 0)
    host, port = srv.server_address[:2]
    buf = bytearray(8 << 20)
    times = []
    try:
        for i in range(7):
            with socket.create_connection((host, port)) as s:
                t = time.monotonic()
                s.sendall(f"GET /v1/data/ssd/{job}/1/f.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SECRET}\r\nConnection: close\r\n\r\n".encode())
                got = 0
                view = memoryview(buf)
                while n := s.recv_into(view):
                    got += n
                times.append(time.monotonic() - t)
                assert got > size
        print("TPUT MB/s", sorted(round(size / t / 1e6) for t in times), "median", round(size / statistics.median(times) / 1e6))
    finally:
        srv.shutdown(); srv.server_close()
