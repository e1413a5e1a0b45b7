#!/usr/bin/env python3
"""redis-py against bloomgate's RESP listener, under RESP2 and RESP3.

Usage: resp_redis_py.py PORT KEY PRESENT ABSENT [TOKEN]

KEY names a resource (or a [resp.keys] alias) whose filter holds PRESENT
and not ABSENT. Every check asserts; the exit status says whether all held.
With TOKEN, writes are tried without and with AUTH.
"""
import sys

import redis


def check(port, key, present, absent, token, protocol):
    r = redis.Redis(port=port, protocol=protocol, decode_responses=True)
    assert r.ping() is True
    bf = r.bf()
    # BF.EXISTS: an int under RESP2, a bool under RESP3 (RedisBloom's types);
    # both compare equal to 1/True and 0/False.
    assert bf.exists(key, present) == 1, "present key"
    assert bf.exists(key, absent) == 0, "absent key"
    # A name that is no filter is an error, not RedisBloom's 0: a typo must
    # not make a whole table look empty.
    try:
        bf.exists("no-such-filter", present)
        raise AssertionError("BF.EXISTS of an unknown filter answered")
    except redis.ResponseError as e:
        assert str(e).startswith("no filter named 'no-such-filter'"), e
    assert list(bf.mexists(key, present, absent)) == [1, 0]
    info = bf.info(key)
    # RESP2: redis-py's BFInfo; RESP3: the map itself (redis-py's legacy
    # response shape passes RESP3 maps through).
    if isinstance(info, dict):
        fields = info
    else:
        fields = {
            "Capacity": info.capacity,
            "Size": info.size,
            "Number of filters": info.filterNum,
            "Number of items inserted": info.insertedNum,
            "Expansion rate": info.expansionRate,
        }
    assert fields["Number of items inserted"] >= 1, fields
    assert fields["Capacity"] >= 1 and fields["Size"] >= 1, fields
    assert fields["Number of filters"] == 1, fields
    assert fields["Expansion rate"] is None, fields
    p = r.pipeline(transaction=False)
    for _ in range(100):
        p.execute_command("BF.EXISTS", key, present)
        p.execute_command("BF.EXISTS", key, absent)
    got = p.execute()
    assert [int(g) for g in got] == [1, 0] * 100, got[:6]
    try:
        r.execute_command("BF.RESERVE", key, "0.01", "100")
        raise AssertionError("BF.RESERVE answered")
    except redis.ResponseError as e:
        assert "not supported" in str(e), e
    try:
        r.execute_command("NOSUCHCOMMAND")
        raise AssertionError("an unknown command answered")
    except redis.ResponseError as e:
        assert str(e).startswith("unknown command"), e
    if token:
        try:
            bf.add(key, present)
            raise AssertionError("BF.ADD without AUTH answered")
        except redis.AuthenticationError:
            pass
        except redis.ResponseError as e:
            assert "NOAUTH" in str(e) or "Authentication" in str(e), e
        authed = redis.Redis(port=port, protocol=protocol, password=token, decode_responses=True)
        assert authed.bf().add(key, present) == 0, "a key the filter holds is not new"
    return "RESP%d ok" % protocol


def main():
    port, key, present, absent = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    token = sys.argv[5] if len(sys.argv) > 5 else None
    for protocol in (2, 3):
        print(check(port, key, present, absent, token, protocol))


if __name__ == "__main__":
    main()
