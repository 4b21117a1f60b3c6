# Forwards TCP from LHOST:LPORT to RHOST:RPORT: the Knative autoscaler, in a
# network namespace of its own, reaches the API server on loopback through it.
#   python3 forward.py LHOST LPORT RHOST RPORT
import asyncio, sys
lhost, lport, rhost, rport = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data); await w.drain()
    finally:
        w.close()
async def handle(r, w):
    r2, w2 = await asyncio.open_connection(rhost, rport)
    await asyncio.gather(pipe(r, w2), pipe(r2, w), return_exceptions=True)
async def main():
    s = await asyncio.start_server(handle, lhost, lport)
    async with s: await s.serve_forever()
asyncio.run(main())
