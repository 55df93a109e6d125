"""The tests outside tests/contracts decode ABI data with eth-abi as production does.

Ape's pytest plugin swaps eth-abi's global decoders for lenient ones that pad truncated data;
those tests run without it (``-p no:ape_test``, tests/conftest.py), so a decoder that refuses
truncated chain data in production refuses it in the tests too.
"""

from __future__ import annotations

import sys

import pytest
from eth_abi import decode
from eth_abi.exceptions import InsufficientDataBytes


def test_truncated_abi_data_is_refused_as_in_production() -> None:
    with pytest.raises(InsufficientDataBytes):
        decode(["uint256"], bytes(31))
    assert decode(["uint256"], (7).to_bytes(32, "big")) == (7,)


def test_ape_is_not_loaded() -> None:
    assert "ape" not in sys.modules
