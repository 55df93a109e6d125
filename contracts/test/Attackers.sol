// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

// Attacker contracts for the tests (tests/contracts). Never deployed by the product:
// gridmarket.build skips contracts/test/.

interface IEscrowLike {
    function withdraw() external;
    function withdrawTo(address payable to) external;
    function registerProvider(string calldata metadataCid) external payable;
    function submitResult(bytes32 jobId, JobLike calldata job, string calldata outputCid)
        external;
}

struct JobLike {
    address submitter;
    uint96 bounty;
    address provider;
    uint40 deadline;
    uint40 submittedAt;
    uint16 feeBps;
    uint16 attempt;
    bytes32 resultDigest;
}

/// @notice A provider whose receive() re-enters withdraw() to drain the escrow.
contract ReentrantProvider {
    IEscrowLike public immutable escrow;
    uint256 public reentries;
    bool public reentryBlocked;

    constructor(IEscrowLike escrow_) {
        escrow = escrow_;
    }

    function register(string calldata cid) external payable {
        escrow.registerProvider{value: msg.value}(cid);
    }

    function submit(bytes32 jobId, JobLike calldata job, string calldata cid) external {
        escrow.submitResult(jobId, job, cid);
    }

    function drain() external {
        escrow.withdraw();
    }

    receive() external payable {
        if (reentries < 3) {
            reentries += 1;
            try escrow.withdraw() {} catch {
                reentryBlocked = true;
            }
        }
    }
}

/// @notice A provider that cannot receive ETH at all.
contract RevertingProvider {
    IEscrowLike public immutable escrow;

    constructor(IEscrowLike escrow_) {
        escrow = escrow_;
    }

    function register(string calldata cid) external payable {
        escrow.registerProvider{value: msg.value}(cid);
    }

    function submit(bytes32 jobId, JobLike calldata job, string calldata cid) external {
        escrow.submitResult(jobId, job, cid);
    }

    function drain() external {
        escrow.withdraw();
    }

    function rescue(address payable to) external {
        escrow.withdrawTo(to);
    }

    receive() external payable {
        revert("no ETH please");
    }
}
