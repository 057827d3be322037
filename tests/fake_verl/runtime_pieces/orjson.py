"""Stand-in for orjson (verl/utils/tracking.py:29 imports it for the file logger): `dumps` to bytes."""

import json

OPT_SERIALIZE_NUMPY = 16


def dumps(data, option=None):
    return json.dumps(data, separators=(",", ":")).encode()
