// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

// Attacker contracts for the tests (tests/contracts). Never deployed by the product:
// gridmarket.build skips contracts/test/.
//
// A contract cannot sign an EIP-712 acceptance, so it can never be assigned a job (escrow
// version 2); these wallets get a withdrawable balance as submitters instead (`exec` forwards
// any escrow call, e.g. createJob then cancel).

interface IEscrowLike {
    function withdraw() external;
    function withdrawTo(address payable to) external;
}

/// @dev Forward `data` to the escrow with the ETH sent; bubble a revert up unchanged.
abstract contract Forwarder {
    IEscrowLike public immutable escrow;

    constructor(IEscrowLike escrow_) {
        escrow = escrow_;
    }

    function exec(bytes calldata data) external payable {
        (bool ok, bytes memory ret) = address(escrow).call{value: msg.value}(data);
        if (!ok) {
            assembly ("memory-safe") {
                revert(add(ret, 32), mload(ret))
            }
        }
    }

    function drain() external {
        escrow.withdraw();
    }
}

/// @notice A wallet whose receive() re-enters withdraw() to drain the escrow.
contract ReentrantProvider is Forwarder {
    uint256 public reentries;
    bool public reentryBlocked;
    bytes4 public blockedWith; // the selector of the error the re-entered withdraw reverted with

    constructor(IEscrowLike escrow_) Forwarder(escrow_) {}

    receive() external payable {
        if (reentries < 3) {
            reentries += 1;
            try escrow.withdraw() {}
            catch (bytes memory reason) {
                reentryBlocked = true;
                blockedWith = bytes4(reason);
            }
        }
    }
}

/// @notice A wallet that cannot receive ETH at all.
contract RevertingProvider is Forwarder {
    constructor(IEscrowLike escrow_) Forwarder(escrow_) {}

    function rescue(address payable to) external {
        escrow.withdrawTo(to);
    }

    receive() external payable {
        revert("no ETH please");
    }
}
