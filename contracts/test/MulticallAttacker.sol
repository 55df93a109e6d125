// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

// Attacker wallet for tests/contracts/test_multicall.py. Never deployed by the product:
// gridmarket.build skips contracts/test/.

interface IMulticallEscrow {
    function multicall(bytes[] calldata data) external returns (bytes[] memory results);
}

/// @notice A wallet that withdraws through `multicall` and, on receiving ETH, re-enters the
///         escrow through `multicall` again (a batch of two withdraws) to drain it.
contract MulticallReentrant {
    IMulticallEscrow public immutable escrow;
    uint256 public reentries;
    bool public reentryBlocked;
    bytes4 public blockedWith; // the selector of the error the re-entered batch reverted with

    constructor(IMulticallEscrow escrow_) {
        escrow = escrow_;
    }

    /// @dev Forward `data` to the escrow with the ETH sent; bubble a revert up unchanged.
    function exec(bytes calldata data) external payable {
        (bool ok, bytes memory ret) = address(escrow).call{value: msg.value}(data);
        if (!ok) {
            assembly ("memory-safe") {
                revert(add(ret, 32), mload(ret))
            }
        }
    }

    function drain() external {
        bytes[] memory calls = new bytes[](1);
        calls[0] = abi.encodeWithSignature("withdraw()");
        escrow.multicall(calls);
    }

    receive() external payable {
        if (reentries < 3) {
            reentries += 1;
            bytes[] memory calls = new bytes[](2);
            calls[0] = abi.encodeWithSignature("withdraw()");
            calls[1] = abi.encodeWithSignature("withdraw()");
            try escrow.multicall(calls) {}
            catch (bytes memory reason) {
                reentryBlocked = true;
                blockedWith = bytes4(reason);
            }
        }
    }
}
