// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

// An attacker for the indexers' tests (tests/scheduler/test_chain_poison.py): it emits the
// escrow's events with whatever a caller passes, including what JobEscrow itself refuses (empty
// or overlong strings) and logs whose data is not the event's ABI encoding. A reader pointed at
// it must decode every log on its own and never stop. Never deployed by the product.
contract EventForger {
    event JobCreated(
        bytes32 indexed jobId,
        address indexed submitter,
        uint96 bounty,
        uint40 deadline,
        uint16 feeBps,
        address operator,
        address mediator,
        uint96 collateral,
        uint8 flags,
        address token,
        bytes32 salt,
        string specCid
    );
    event ProviderRegistered(address indexed provider, bytes32 metadataDigest, string metadataCid);

    /// @notice Emit `JobCreated` for `jobId` with `specCid` as raw bytes (any length, any bytes).
    function jobCreated(bytes32 jobId, bytes calldata specCid, uint40 deadline) external {
        emit JobCreated(
            jobId,
            msg.sender,
            1e16,
            deadline,
            0,
            address(0),
            msg.sender,
            1e16,
            0,
            address(0),
            bytes32(0),
            string(specCid)
        );
    }

    /// @notice Emit `ProviderRegistered` for the caller with `metadataCid` as raw bytes.
    function providerRegistered(bytes calldata metadataCid) external {
        emit ProviderRegistered(msg.sender, keccak256(metadataCid), string(metadataCid));
    }

    /// @notice A log with `JobCreated`'s topics over `data` that need not decode as it.
    function garbage(bytes32 jobId, bytes calldata data) external {
        bytes32 topic = JobCreated.selector;
        bytes memory body = data;
        bytes32 sender = bytes32(uint256(uint160(msg.sender)));
        assembly ("memory-safe") {
            log3(add(body, 32), mload(body), topic, jobId, sender)
        }
    }
}
