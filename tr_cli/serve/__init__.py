"""`tr serve` without the command line: the OpenAI HTTP API over one decoder.

schema.py (what clients send), requests.py (a request becomes a decode job), worker.py (one
decoder, one job at a time, KV reuse, periodic saves), responses.py (the OpenAI response and
chunk shapes), app.py (the FastAPI routes, auth, limits, the access log). cli/serve.py starts
uvicorn and owns the signals.
"""
