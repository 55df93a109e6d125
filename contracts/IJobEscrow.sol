// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// @title IJobEscrow
/// @notice Types, events and errors of the GridMarket job escrow and provider registry.
/// @dev Everything an indexer (the scheduler's chain watcher, the payouts explorer) needs is in
///      the events: it never has to read contract storage.
interface IJobEscrow {
    /// @notice Where a job is in its on-chain life.
    /// None -> Funded -> Assigned -> Submitted -> Released, with Funded|Assigned -> Refunded,
    /// Assigned -> Funded (unassign) and Submitted -> Funded (reject).
    enum Status {
        None,
        Funded,
        Assigned,
        Submitted,
        Released,
        Refunded
    }

    /// @notice The full terms and progress of one job.
    /// @dev Only `keccak256(abi.encode(job))` is stored (one slot per job, with the status in its
    ///      low byte); callers pass the struct back, rebuilt from the events, and the contract
    ///      checks it against the commitment. `JobEscrow.jobOf`-style getters would cost every
    ///      job 3 more storage slots; see docs/contracts.md.
    struct Job {
        address submitter;
        uint96 bounty; // wei locked by the submitter
        address provider; // zero until assigned
        uint40 deadline; // unix seconds; no result accepted after it
        uint40 submittedAt; // zero until a result is submitted
        uint16 feeBps; // platform fee snapshot taken at creation
        uint16 attempt; // assignment counter: a provider signature covers one assignment
        bytes32 resultDigest; // keccak256(bytes(outputCid)), zero until a result
    }

    /// @notice A provider's registry entry.
    struct Provider {
        uint96 stake; // collateral, slashable, includes `unstakePending`
        uint96 unstakePending; // part of `stake` that is on its way out
        uint40 unstakeAt; // when `unstakePending` may be withdrawn
        bool registered;
    }

    // ---------------------------------------------------------------- job events
    /// @notice A submitter funded a job. `specCid` names the job spec on IPFS.
    event JobCreated(
        bytes32 indexed jobId,
        address indexed submitter,
        uint96 bounty,
        uint40 deadline,
        uint16 feeBps,
        bytes32 salt,
        string specCid
    );
    /// @notice The operator gave the job to `provider` (attempt counts assignments).
    event JobAssigned(
        bytes32 indexed jobId, address indexed provider, address previousProvider, uint16 attempt
    );
    /// @notice The operator took the job back from `provider` (lease lost); it is Funded again.
    event JobUnassigned(bytes32 indexed jobId, address indexed provider, uint16 attempt);
    /// @notice The assigned provider delivered `outputCid` (sent by itself or relayed).
    event ResultSubmitted(
        bytes32 indexed jobId,
        address indexed provider,
        uint16 attempt,
        uint40 submittedAt,
        string outputCid
    );
    /// @notice The result was rejected; the job is Funded again and the provider was slashed.
    event ResultRejected(
        bytes32 indexed jobId, address indexed provider, uint16 attempt, uint96 slashed
    );
    /// @notice The bounty was paid: `payout` to the provider's balance and `fee` to the fees
    ///         accrued for the treasury. Who released it (operator, submitter, provider's claim)
    ///         is the transaction's sender.
    event JobReleased(
        bytes32 indexed jobId,
        address indexed provider,
        address indexed submitter,
        uint96 payout,
        uint96 fee
    );
    /// @notice The bounty went back to the submitter's balance (cancelled, or deadline passed).
    event JobRefunded(bytes32 indexed jobId, address indexed submitter, uint96 amount);

    // ---------------------------------------------------------------- money events
    /// @notice Accrued platform fees were credited to the treasury's balance.
    event FeesCollected(address indexed treasury, uint256 amount);
    /// @notice `account` withdrew `amount` of its balance to `to`.
    event Withdrawn(address indexed account, address indexed to, uint256 amount);

    // ---------------------------------------------------------------- registry events
    /// @notice A provider registered (or updated) its metadata commitment.
    event ProviderRegistered(address indexed provider, bytes32 metadataDigest, string metadataCid);
    /// @notice A provider added collateral.
    event Staked(address indexed provider, uint96 amount, uint96 totalStake);
    /// @notice A provider asked to take `amount` of its stake out, available at `availableAt`.
    event UnstakeRequested(address indexed provider, uint96 amount, uint40 availableAt);
    /// @notice Stake left the registry and was credited to the provider's balance.
    event Unstaked(address indexed provider, uint96 amount, uint96 totalStake);
    /// @notice Stake was slashed for a rejected result and credited to `beneficiary`.
    event ProviderSlashed(
        address indexed provider, bytes32 indexed jobId, uint96 amount, address beneficiary
    );

    // ---------------------------------------------------------------- admin events
    /// @notice The owner proposed a new owner; it must accept.
    event OwnershipTransferStarted(address indexed previousOwner, address indexed newOwner);
    /// @notice Ownership moved.
    event OwnershipTransferred(address indexed previousOwner, address indexed newOwner);
    /// @notice The operator (scheduler's key) changed.
    event OperatorChanged(address indexed previousOperator, address indexed newOperator);
    /// @notice The fee recipient changed.
    event TreasuryChanged(address indexed previousTreasury, address indexed newTreasury);
    /// @notice The fee for new jobs changed (existing jobs keep theirs).
    event FeeChanged(uint16 previousFeeBps, uint16 newFeeBps);

    // ---------------------------------------------------------------- errors
    error JobEscrowNotOwner(address caller);
    error JobEscrowNotPendingOwner(address caller);
    error JobEscrowNotOperator(address caller);
    error JobEscrowNotSubmitter(address caller, address submitter);
    error JobEscrowNotProvider(address caller, address provider);
    error JobEscrowNotAllowed(address caller);
    error JobEscrowZeroAddress();
    error JobEscrowFeeTooHigh(uint16 feeBps, uint16 maxFeeBps);
    error JobEscrowBountyTooLow(uint256 bounty, uint256 minBounty);
    error JobEscrowBountyTooHigh(uint256 bounty, uint256 maxBounty);
    error JobEscrowDeadlineOutOfRange(uint256 deadline, uint256 earliest, uint256 latest);
    error JobEscrowBadSpecCid(uint256 length);
    error JobEscrowBadOutputCid(uint256 length);
    error JobEscrowJobExists(bytes32 jobId);
    error JobEscrowUnknownJob(bytes32 jobId);
    error JobEscrowJobMismatch(bytes32 jobId);
    error JobEscrowWrongStatus(bytes32 jobId, Status status);
    error JobEscrowDeadlinePassed(bytes32 jobId, uint256 deadline, uint256 nowTs);
    error JobEscrowDeadlineNotPassed(bytes32 jobId, uint256 deadline, uint256 nowTs);
    error JobEscrowSameProvider(bytes32 jobId, address provider);
    error JobEscrowChallengeWindowOpen(bytes32 jobId, uint256 claimableAt, uint256 nowTs);
    error JobEscrowChallengeWindowClosed(bytes32 jobId, uint256 closedAt, uint256 nowTs);
    error JobEscrowBadSignature(bytes32 jobId, address recovered, address provider);
    error JobEscrowNothingToWithdraw(address account);
    error JobEscrowWithdrawFailed(address to, uint256 amount);
    error JobEscrowReentrancy();
    error ProviderRegistryNotRegistered(address provider);
    error ProviderRegistryInsufficientStake(address provider, uint256 stake, uint256 minStake);
    error ProviderRegistryBadMetadataCid(uint256 length);
    error ProviderRegistryZeroAmount();
    error ProviderRegistryStakeTooHigh(uint256 total, uint256 maxStake);
    error ProviderRegistryUnstakeTooLarge(uint256 amount, uint256 available);
    error ProviderRegistryUnstakeNotReady(uint256 availableAt, uint256 nowTs);
    error ProviderRegistryNoUnstakePending(address provider);
}
