"""A model ready to decode: loaded, with its hot matrix and a decoder, from one set of options.

The command line, and anything else that decodes for a user (chat, bench, a server), builds its
decoder here from options checked beforehand (options.py): load -> sampling merged with the
model's generation config -> matrix -> decoder (calibrated for a designed tree), and the result
describes itself in one banner.
"""
