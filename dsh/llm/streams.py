"""Counted randomness: every sampled row draws from its own stream, a hash of the sampling seed and the row's key,
and each draw is a hash of the stream, the token index and the vocabulary index, so that the same question gets the
same sample whatever batch it runs in and on any device (the engine's sampling, its C kernels bit for bit)."""

_M31 = 0x7FFFFFFF


def _mix31(x):
    """A bijective integer hash on [0, 2^31) (xor-shift-multiply rounds; products stay below 2^62, so int64
    arithmetic never overflows), for tensors of int64 or Python ints."""
    for mult in (0x2C1B3C6D, 0x297A2D39, 0x3C6EF372):
        x = ((x ^ (x >> 16)) * mult) & _M31
    return x ^ (x >> 15)


def stream_key(seed: int, key: int) -> int:
    """The random stream of a row: a hash of the sampling seed and the row's key."""
    return _mix31((_mix31(seed & _M31) ^ (key & _M31)) & _M31)


def counted_uniform(key, step, index):
    """Uniforms in (0, 1), one per (row, vocabulary index): a hash of the row's stream ``key [R]``, its token
    index ``step [R]`` and ``index [V]``; the same arguments give the same numbers on any device and in any
    batch (24 bits each)."""
    h = _mix31((_mix31(key & _M31) ^ (step & _M31)) & _M31)
    h = _mix31((h[:, None] ^ index[None, :]) & _M31)
    return ((h >> 7).float() + 0.5) / float(1 << 24)
