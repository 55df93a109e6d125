// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// @notice Test tokens that misbehave the ways real ones do, for the escrow's token tests.
/// @dev `FeeOnTransferToken` keeps 1% of every transfer (the escrow must refuse it);
///      `NoReturnToken` returns nothing from transfer/transferFrom, as USDT does (the escrow must
///      accept it); `FalseToken` returns false instead of reverting (the escrow must treat it as a
///      failure); `RebasingToken` grows every balance at each transfer (the escrow must refuse it).
contract OddToken {
    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;
    uint256 public immutable feeBps;
    bool public failQuietly;

    constructor(uint256 feeBps_) {
        feeBps = feeBps_;
    }

    function mint(address to, uint256 value) external {
        balanceOf[to] += value;
    }

    function approve(address spender, uint256 value) external returns (bool) {
        allowance[msg.sender][spender] = value;
        return true;
    }

    function setFailQuietly(bool fail) external {
        failQuietly = fail;
    }

    function _move(address from, address to, uint256 value) internal returns (bool) {
        if (failQuietly) return false;
        require(balanceOf[from] >= value, "balance");
        uint256 fee = (value * feeBps) / 10_000;
        balanceOf[from] -= value;
        balanceOf[to] += value - fee;
        return true;
    }

    function _spend(address from, uint256 value) internal {
        require(allowance[from][msg.sender] >= value, "allowance");
        allowance[from][msg.sender] -= value;
    }
}

contract FeeOnTransferToken is OddToken(100) {
    function transfer(address to, uint256 value) external returns (bool) {
        return _move(msg.sender, to, value);
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        _spend(from, value);
        return _move(from, to, value);
    }
}

contract NoReturnToken is OddToken(0) {
    function transfer(address to, uint256 value) external {
        require(_move(msg.sender, to, value), "failed");
    }

    function transferFrom(address from, address to, uint256 value) external {
        _spend(from, value);
        require(_move(from, to, value), "failed");
    }
}

contract FalseToken is OddToken(0) {
    function transfer(address to, uint256 value) external returns (bool) {
        return _move(msg.sender, to, value);
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        _spend(from, value);
        return _move(from, to, value);
    }
}

/// @notice A rebasing-style token: balances are shares times an index that grows 1% at every
///         transfer, so what the escrow holds moves by more than the amount transferred (the
///         escrow must refuse it: its balances in a token are plain amounts).
contract RebasingToken {
    mapping(address => uint256) public shares;
    mapping(address => mapping(address => uint256)) public allowance;
    uint256 public index = 1e18;

    function balanceOf(address account) external view returns (uint256) {
        return (shares[account] * index) / 1e18;
    }

    function mint(address to, uint256 value) external {
        shares[to] += (value * 1e18) / index;
    }

    function approve(address spender, uint256 value) external returns (bool) {
        allowance[msg.sender][spender] = value;
        return true;
    }

    function transfer(address to, uint256 value) external returns (bool) {
        _move(msg.sender, to, value);
        return true;
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        require(allowance[from][msg.sender] >= value, "allowance");
        allowance[from][msg.sender] -= value;
        _move(from, to, value);
        return true;
    }

    function _move(address from, address to, uint256 value) private {
        uint256 s = (value * 1e18) / index;
        shares[from] -= s;
        shares[to] += s;
        index = (index * 101) / 100; // the rebase
    }
}
