// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// @title IJobEscrow (version 5)
/// @notice Types, events and errors of the GridMarket job escrow and provider registry.
/// @dev Everything an indexer (the scheduler's chain watcher, the payouts explorer) needs is in
///      the events: it never has to read contract storage.
///
///      Trust model (docs/trust.md): no key in the middle can move a bounty or a stake.
///      - The operator (the scheduler's key, named by the submitter at funding and checked
///        against the one in office) only chooses which *willing* provider gets a job: `assign`
///        needs the provider's EIP-712 acceptance, which names the time the provider is given
///        (`holdFor`): nobody but the provider can take the job back before that time is over.
///        The operator, treasury, submitter and mediator can never be the provider, and one
///        wallet holds at most one seat of a replicated job.
///      - A result is paid when the submitter accepts it, when nobody objected within the
///        challenge window (anyone may then `finalize`), when the mediator the submitter named at
///        funding upholds it, or, only for jobs the submitter funded with `FLAG_ON_VERIFY`, when
///        the job's operator pays it at once on its own check.
///      - A provider's collateral for a job (fixed at funding, at least `minCollateralBps` of the
///        bounty) is locked from assignment until the job is final; only a ruling of the job's
///        mediator slashes it. Unstaking only ever takes free stake.
///      - The owner's settings (operator, fee, treasury, mediator list) reach only jobs funded
///        after the change.
///      - A replicated job (`createJob` with `replicas`, k = 2..5 seats, one share each) is paid
///        only on an outcome the contract can check: `resolve` pays the seats whose output
///        digests agree in a strict majority of the k seats (one wallet each), and slashes the
///        seats that disagree; without a majority (all seats delivered, or the deadline passed) only the
///        job's mediator can rule a seat (`rule`, until `deadline + mediationWindow`), and
///        nobody is paid without one. The submitter cancels a group only while every seat is
///        Funded (`resolve`), never a seat alone.
///      - A job is funded in ETH or in an ERC-20 token the owner allow-listed (`createJobWith`,
///        one transaction with `permitToken` in a `multicall`). Everything about the job then
///        moves in that token: bounty, payout, fee, refund, collateral (locked from the
///        provider's stake in the token) and the dispute deposit. Unlisting a token only stops
///        new jobs and stakes in it. A token that moves less than it was asked to (fee on
///        transfer) is refused at the transfer.
interface IJobEscrow {
    /// @notice Where a job is in its on-chain life.
    /// None -> Funded -> Assigned -> Submitted -> Released, with Funded|Assigned -> Refunded
    /// (and Submitted -> Refunded for a seat of a replicated job that `resolve` did not pay),
    /// Assigned -> Funded (unassign), Submitted -> Disputed (submitter), and
    /// Submitted|Disputed -> Funded (the mediator ruled the result wrong) or -> Released.
    enum Status {
        None,
        Funded,
        Assigned,
        Submitted,
        Released,
        Refunded,
        Disputed
    }

    /// @notice The full terms and progress of one job.
    /// @dev Only `keccak256(abi.encode(job))` is stored (one slot per job, with the status in its
    ///      low byte); callers pass the struct back, rebuilt from the events, and the contract
    ///      checks it against the commitment. Every transition's events fold to the stored
    ///      commitment (gridmarket.escrow.apply_event).
    struct Job {
        address submitter;
        uint96 bounty; // wei locked by the submitter
        address provider; // zero unless assigned
        uint40 deadline; // unix seconds; no result accepted after it
        uint40 since; // when the current assignment (Assigned) or result (Submitted) began
        uint16 feeBps; // platform fee snapshot taken at creation
        uint16 attempt; // assignment counter: a provider signature covers one assignment
        bytes32 resultDigest; // keccak256(bytes(outputCid)), zero unless a result is pending
        address operator; // the operator at funding: the only key that may assign this job
        address mediator; // named by the submitter at funding: the only key that may rule
        uint96 collateral; // wei of the provider's stake locked while it holds this job
        uint40 disputedAt; // when the submitter disputed the pending result; zero otherwise
        uint8 flags; // FLAG_ON_VERIFY (operator pays at once), FLAG_SPOT, or the seat count
        address token; // what the job is paid in: zero for ETH, else an allow-listed ERC-20
        uint40 holdUntil; // Assigned: the end of the time the provider signed for; zero otherwise
    }

    /// @notice A provider's registry entry (`providerOf`: ETH stake and registration) or its
    ///         stake in one token (`stakeOf`; `registered` is unused there).
    struct Provider {
        uint96 stake; // slashable collateral: free (stake - locked) plus locked by jobs
        uint96 locked; // part of `stake` backing jobs the provider holds
        uint40 unstakeAt; // when `unstakePending` may be withdrawn
        bool registered;
        uint96 unstakePending; // taken out of `stake`, on its way to the balance; not slashable
    }

    // ---------------------------------------------------------------- job events
    /// @notice A submitter funded a job with these terms. `specCid` names the job spec on IPFS.
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
    /// @notice The job's operator gave the job to `provider`, who accepted it (attempt counts
    ///         assignments); `since` is the assignment time and `holdUntil` the end of the time
    ///         the provider signed for (nobody but the provider can take the job back before it).
    ///         The job's collateral is now locked from the provider's stake (and unlocked from
    ///         `previousProvider`'s).
    event JobAssigned(
        bytes32 indexed jobId,
        address indexed provider,
        address previousProvider,
        uint16 attempt,
        uint40 since,
        uint40 holdUntil
    );
    /// @notice The job went back to Funded: the provider handed it back or the operator took it
    ///         back once its hold (`holdUntil`, at least `reassignDelay`) was over. The
    ///         collateral is unlocked, nobody is slashed.
    event JobUnassigned(bytes32 indexed jobId, address indexed provider, uint16 attempt);
    /// @notice The assigned provider delivered `outputCid` (sent by itself or relayed).
    event ResultSubmitted(
        bytes32 indexed jobId,
        address indexed provider,
        uint16 attempt,
        uint40 submittedAt,
        string outputCid
    );
    /// @notice The submitter disputed the pending result, depositing `deposit` (or, for a spot
    ///         job, the mediator opened a check of it, funded by the deposit locked at
    ///         funding); the job's mediator rules on it.
    event ResultDisputed(
        bytes32 indexed jobId, address indexed provider, uint40 disputedAt, uint96 deposit
    );
    /// @notice The job's mediator ruled on the pending result. `upheld`: the result is paid
    ///         (JobReleased follows). Otherwise the provider lost the job's collateral
    ///         (ProviderSlashed follows) and the job is Funded again.
    event Ruled(
        bytes32 indexed jobId,
        address indexed mediator,
        address indexed provider,
        uint16 attempt,
        bool upheld
    );
    /// @notice The bounty was paid: `payout` to the provider's balance and `fee` to the fees
    ///         accrued for the treasury. The collateral is unlocked.
    event JobReleased(
        bytes32 indexed jobId,
        address indexed provider,
        address indexed submitter,
        uint96 payout,
        uint96 fee
    );
    /// @notice A submitter funded a replicated job: `replicas` seats (jobs) with ids
    ///         `keccak256(abi.encode(groupId, i))` for i in 0..replicas-1, each with its own
    ///         JobCreated (whose `salt` is `groupId`) and an equal share of the bounty.
    event ReplicasCreated(
        bytes32 indexed groupId, address indexed submitter, uint8 replicas, bytes32 salt
    );
    /// @notice The seats of a replicated job were resolved: `agreeing` seats (one provider
    ///         each) delivered `resultDigest`. Zero when no majority was reached before the
    ///         deadline and the mediation window, or when the submitter cancelled a group no
    ///         seat held: the open seats were refunded, nobody slashed. The majority's seats are
    ///         paid (JobReleased), the others refunded (JobRefunded), and a provider whose
    ///         result disagreed lost its collateral (ProviderSlashed).
    event Resolved(bytes32 indexed groupId, bytes32 resultDigest, uint8 agreeing, uint8 replicas);
    /// @notice The bounty went back to the submitter's balance (cancelled, or deadline passed).
    event JobRefunded(bytes32 indexed jobId, address indexed submitter, uint96 amount);

    // ---------------------------------------------------------------- money events
    /// @notice Accrued platform fees in `token` (zero: ETH) were credited to the treasury.
    event FeesCollected(address indexed treasury, address indexed token, uint256 amount);
    /// @notice `account` withdrew `amount` of its balance in `token` (zero: ETH) to `to`.
    event Withdrawn(
        address indexed account, address indexed token, address indexed to, uint256 amount
    );
    /// @notice `amount` was credited to `account`'s balance outside a payout or refund: a
    ///         dispute deposit returned or paid to the mediator (`reason` says which), in the
    ///         job's token.
    event Credited(bytes32 indexed jobId, address indexed account, uint96 amount, string reason);

    // ---------------------------------------------------------------- registry events
    /// @notice A provider registered (or updated) its metadata commitment.
    event ProviderRegistered(address indexed provider, bytes32 metadataDigest, string metadataCid);
    /// @notice A provider added collateral in `token` (zero: ETH).
    event Staked(address indexed provider, address indexed token, uint96 amount, uint96 totalStake);
    /// @notice A provider took `amount` of its free stake in `token` out, available at
    ///         `availableAt`.
    event UnstakeRequested(
        address indexed provider, address indexed token, uint96 amount, uint40 availableAt
    );
    /// @notice Unstaked stake in `token` was credited to the provider's balance.
    event Unstaked(address indexed provider, address indexed token, uint96 amount, uint96 totalStake);
    /// @notice A ruling took `amount` of the provider's locked collateral for `jobId` (in the
    ///         job's token): `toMediator` (at most two dispute deposits) pays the mediator's
    ///         re-run and its tie-break, the rest went to the submitter.
    event ProviderSlashed(
        address indexed provider,
        bytes32 indexed jobId,
        uint96 amount,
        address submitter,
        uint96 toMediator
    );

    // ---------------------------------------------------------------- admin events
    /// @notice The operator for jobs funded from now on changed (funded jobs keep theirs).
    event OperatorChanged(address indexed previousOperator, address indexed newOperator);
    /// @notice The fee recipient changed.
    event TreasuryChanged(address indexed previousTreasury, address indexed newTreasury);
    /// @notice The fee for new jobs changed (existing jobs keep theirs).
    event FeeChanged(uint16 previousFeeBps, uint16 newFeeBps);
    /// @notice A mediator was added to or removed from the list submitters pick from (funded
    ///         jobs keep the mediator they named).
    event MediatorListed(address indexed mediator, bool listed);
    /// @notice An ERC-20 token was allowed for new jobs and stakes with this smallest bounty in
    ///         its units, or disallowed (zero); jobs funded in it, balances and stakes in it are
    ///         unaffected.
    event TokenListed(address indexed token, uint256 minBounty);

    // ---------------------------------------------------------------- errors
    error JobEscrowNotOwner(address caller);
    error JobEscrowNotOperator(address caller, address operator);
    error JobEscrowNotSubmitter(address caller, address submitter);
    error JobEscrowNotProvider(address caller, address provider);
    error JobEscrowNotMediator(address caller, address mediator);
    error JobEscrowNotAllowed(address caller);
    error JobEscrowZeroAddress();
    error JobEscrowFeeTooHigh(uint16 feeBps, uint16 maxFeeBps);
    error JobEscrowBountyTooLow(uint256 bounty, uint256 minBounty);
    error JobEscrowBountyTooHigh(uint256 bounty, uint256 maxBounty);
    error JobEscrowDeadlineOutOfRange(uint256 deadline, uint256 earliest, uint256 latest);
    error JobEscrowBadSpecCid(uint256 length);
    error JobEscrowBadOutputCid(uint256 length);
    error JobEscrowBadFlags(uint8 flags);
    error JobEscrowMediatorNotListed(address mediator);
    error JobEscrowCollateralTooLow(uint256 collateral, uint256 minCollateral);
    error JobEscrowWrongDeposit(uint256 sent, uint256 deposit);
    error JobEscrowNotOnVerify(bytes32 jobId);
    error JobEscrowReplicated(bytes32 jobId);
    error JobEscrowBadReplicas(uint256 replicas);
    error JobEscrowBountyNotDivisible(uint256 bounty, uint256 replicas);
    error JobEscrowNoMajority(bytes32 groupId, uint256 resolvableAt, uint256 nowTs);
    error JobEscrowSeatsPending(bytes32 groupId, uint256 deadline, uint256 nowTs);
    error JobEscrowConflictOfInterest(bytes32 jobId, address provider);
    error JobEscrowJobExists(bytes32 jobId);
    error JobEscrowJobMismatch(bytes32 jobId);
    error JobEscrowWrongStatus(bytes32 jobId, Status status);
    error JobEscrowDeadlinePassed(bytes32 jobId, uint256 deadline, uint256 nowTs);
    error JobEscrowDeadlineNotPassed(bytes32 jobId, uint256 deadline, uint256 nowTs);
    error JobEscrowSameProvider(bytes32 jobId, address provider);
    error JobEscrowTooEarly(bytes32 jobId, uint256 allowedAt, uint256 nowTs);
    error JobEscrowChallengeWindowOpen(bytes32 jobId, uint256 claimableAt, uint256 nowTs);
    error JobEscrowChallengeWindowClosed(bytes32 jobId, uint256 closedAt, uint256 nowTs);
    error JobEscrowBadSignature(bytes32 jobId, address recovered, address provider);
    error JobEscrowNothingToWithdraw(address account);
    error JobEscrowWithdrawFailed(address to, uint256 amount);
    error JobEscrowTokenNotAllowed(address token);
    error JobEscrowTokenTransferFailed(address token);
    error JobEscrowTokenAmountMismatch(address token, uint256 expected, uint256 received);
    error JobEscrowPermitFailed(address token, uint256 allowance, uint256 needed);
    error JobEscrowOperatorChanged(address expected, address operator);
    error JobEscrowSeatTaken(bytes32 groupId, address provider);
    error JobEscrowMajority(bytes32 groupId);
    error ProviderRegistryNotRegistered(address provider);
    error ProviderRegistryInsufficientStake(address provider, uint256 stake, uint256 minStake);
    error ProviderRegistryInsufficientCollateral(address provider, uint256 free, uint256 needed);
    error ProviderRegistryBadMetadataCid(uint256 length);
    error ProviderRegistryReservedAddress(address account);
    error ProviderRegistryZeroAmount();
    error ProviderRegistryStakeTooHigh(uint256 total, uint256 maxStake);
    error ProviderRegistryUnstakeTooLarge(uint256 amount, uint256 available);
    error ProviderRegistryUnstakeNotReady(uint256 availableAt, uint256 nowTs);
    error ProviderRegistryNoUnstakePending(address provider);
}
