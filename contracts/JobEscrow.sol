// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {Ownable, Ownable2Step} from "@openzeppelin/contracts/access/Ownable2Step.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {Multicall} from "@openzeppelin/contracts/utils/Multicall.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {IJobEscrow} from "./IJobEscrow.sol";
import {IERC20Min, ProviderRegistry} from "./ProviderRegistry.sol";

/// @title JobEscrow (version 5)
/// @notice Per-job escrow for the GridMarket GPU compute marketplace, with no key in the middle
///         that can take a bounty or a stake (docs/trust.md).
///
/// A submitter locks a bounty with `createJob`, naming the terms: the mediator who may rule on
/// the result, the collateral a provider must lock, whether the operator may pay at once on its
/// own check (`FLAG_ON_VERIFY`), and the operator it expects (funding reverts if another one is
/// in office). That operator assigns the job, only to a provider that signed its acceptance of
/// those terms and of the time it is given (EIP-712 `Acceptance`, `holdFor`); the provider's
/// collateral is then locked, and nobody but the provider can take the job back before that
/// time is over. Only that provider can author a result, before the deadline. The
/// result is paid (minus the fee fixed at creation) when the submitter accepts it, when the
/// mediator upholds it, when nobody disputed it within the challenge window (anyone may then
/// `finalize`), or at once by the operator for an on-verify job. A disputed result goes to the
/// mediator; a result ruled wrong costs the provider the job's collateral and the job is Funded
/// again. After the deadline with no result pending, anyone can refund the submitter.
/// A replicated job (`createJob` with `replicas`) is k seats, each a job of its own with an
/// equal share of the bounty, assigned to k providers (one seat per wallet); `resolve` pays the
/// seats whose outputs agree in a strict majority and slashes the ones that disagree (no
/// operator, no challenge window: the agreement is the check). Without a majority only the
/// mediator rules, and only once no seat can still break the tie.
/// A spot job (`FLAG_SPOT`) locks a check deposit beside its bounty; its mediator may open a
/// check of a result (`dispute`, sending nothing) on the attempts the submitter's hidden draw
/// picked (committed in the job spec), and the deposit pays the re-run only if the result was
/// right: a wrong one is slashed, and its collateral pays the re-run instead.
/// A job is paid in ETH (`createJob`) or in an ERC-20 token the owner
/// allow-listed (`createJobWith`); all of its money (bounty, fee, collateral, dispute deposit)
/// is in that token, and balances are kept per account and token.
/// Money only moves into withdrawable balances (pull payments); `withdraw` and `withdrawToken`
/// are the only places it leaves, guarded against reentrancy, so a reverting receiver can only
/// block itself.
///
/// @dev Storage holds one slot per job: keccak256(abi.encode(Job)) with the low byte replaced by
///      the status. See docs/contracts.md for the gas reasoning and the invariants.
contract JobEscrow is
    ProviderRegistry,
    Ownable2Step,
    EIP712,
    ReentrancyGuardTransient,
    Multicall
{
    /// @notice Highest platform fee the owner can ever set: 20%.
    uint16 public constant MAX_FEE_BPS = 2000;
    /// @notice Longest accepted CID string (CIDv1 base32 sha2-256 is 59 characters).
    uint256 internal constant MAX_CID_LENGTH = 128;
    /// @notice Job flag: the job's operator may pay a result at once on its own check
    ///         (`settle`, `release`); the submitter accepts that trust when funding.
    uint8 public constant FLAG_ON_VERIFY = 1;
    /// @notice Job flag: a spot-checked job. Funding locks a check deposit (`depositOf`: the
    ///         bounty) beside the bounty, so `createJob`'s value (a token job's amount) is twice
    ///         the bounty. Within the challenge window the job's mediator (or the submitter) may
    ///         open a check of the pending result with `dispute`, sending nothing: the deposit is
    ///         already here. It pays the mediator's re-run if the result is upheld, stays locked
    ///         for the next attempt if the result is ruled wrong, and goes back to the submitter
    ///         whenever the job ends otherwise. Which attempts are checked is drawn by the
    ///         submitter's client and committed in the job spec (docs/trust.md, "Spot checks").
    uint8 internal constant FLAG_SPOT = 0x10;
    /// @notice Job flags bits 1..3: the number of seats of a replicated job (2..MAX_REPLICAS),
    ///         zero for a single job. Set only by funding with `replicas`.
    uint8 internal constant FLAG_REPLICAS_MASK = 0x0e;
    /// @notice Most seats a replicated job may have.
    uint8 internal constant MAX_REPLICAS = 5;
    /// @notice EIP-712 type of a provider's result.
    bytes32 internal constant RESULT_TYPEHASH =
        keccak256("Result(bytes32 jobId,uint16 attempt,string outputCid)");
    /// @notice EIP-712 type of a provider's acceptance of a job's terms for one assignment.
    bytes32 internal constant ACCEPTANCE_TYPEHASH = keccak256(
        "Acceptance(bytes32 jobId,uint16 attempt,uint96 bounty,uint16 feeBps,uint40 deadline,"
        "uint96 collateral,address mediator,uint8 flags,address token,uint32 holdFor)"
    );
    /// @dev Size of an ABI-encoded Job: 15 static words.
    uint256 private constant _JOB_BYTES = 0x1e0;

    /// @notice Smallest bounty accepted, in wei.
    uint96 public immutable minBounty;
    /// @notice Shortest time from creation to deadline, in seconds.
    uint40 public immutable minDuration;
    /// @notice Longest time from creation to deadline, in seconds.
    uint40 public immutable maxDuration;
    /// @notice Seconds after a result during which the submitter may dispute it and the mediator
    ///         may rule on it; then anyone may finalize it (pay the provider).
    uint40 public immutable challengeWindow;
    /// @notice Smallest collateral a job may ask of its provider, in basis points of the bounty.
    uint16 public immutable minCollateralBps;
    /// @notice The least a submitter deposits to dispute the result of an ETH job, in wei: the
    ///         deposit is the job's bounty (in its token for a token job), and for an ETH job at
    ///         least this (`depositOf`). It pays the mediator's re-run if the result is upheld
    ///         and comes back otherwise.
    uint96 public immutable disputeDeposit;
    /// @notice Seconds the mediator has to rule on a dispute; then anyone may finalize it (the
    ///         result stands, the deposit goes back to the submitter).
    uint40 public immutable mediationWindow;
    /// @notice Least seconds after an assignment before the operator may take the job back
    ///         (`unassign` or reassign) without the provider, whatever time the provider signed
    ///         for (`holdUntil`, which may be longer): enough for a provider whose result the
    ///         operator withholds to post it on-chain itself.
    uint40 public immutable reassignDelay;

    // Storage packing (docs/contracts.md): `operator` and `feeBps` share a slot, so createJob
    // reads one slot for both; `feesAccrued` and `treasury` share the next, so collectFees
    // reads one slot and a release writes the fee pot without touching the operator's.
    /// @notice The operator for jobs funded from now on (each job keeps the one it was funded
    ///         under).
    address public operator;
    /// @notice Fee for jobs created from now on, in basis points of the bounty.
    uint16 public feeBps;
    /// @notice Fees released but not yet credited to the treasury (`collectFees`).
    uint96 public feesAccrued;
    /// @notice Receives platform fees (into its withdrawable balance, via `collectFees`).
    address public treasury;
    /// @notice Mediators a submitter may name (besides itself) for jobs funded from now on.
    mapping(address mediator => bool) public isListedMediator;

    /// @notice Fees in a token released but not yet credited to the treasury.
    mapping(address token => uint256) public tokenFeesAccrued;

    mapping(bytes32 jobId => uint256) private _jobs;
    mapping(address account => uint256) private _balances;
    mapping(address account => mapping(address token => uint256)) private _tokenBalances;
    /// @dev The seat (index + 1) a provider was ever assigned in a replicated job; zero for
    ///      none. One wallet holds at most one seat of a group.
    mapping(bytes32 groupId => mapping(address provider => uint256)) private _seatOf;

    /// @notice Everything fixed for the lifetime of a deployment.
    struct Params {
        address operator;
        address treasury;
        uint16 feeBps;
        uint96 minBounty;
        uint40 minDuration;
        uint40 maxDuration;
        uint40 challengeWindow;
        uint96 minStake;
        uint40 unstakeDelay;
        uint16 minCollateralBps;
        uint96 disputeDeposit;
        uint40 mediationWindow;
        uint40 reassignDelay;
        address mediator; // listed at deployment (zero: none)
    }

    /// @param p Deployment parameters; the deployer becomes the owner.
    constructor(Params memory p)
        ProviderRegistry(p.minStake, p.unstakeDelay)
        Ownable(msg.sender)
        EIP712("GridMarket JobEscrow", "5") // Acceptance names its holdFor since version 5
    {
        if (p.operator == address(0) || p.treasury == address(0)) revert JobEscrowZeroAddress();
        if (p.feeBps > MAX_FEE_BPS) revert JobEscrowFeeTooHigh(p.feeBps, MAX_FEE_BPS);
        if (p.minDuration > p.maxDuration) {
            revert JobEscrowDeadlineOutOfRange(p.minDuration, 0, p.maxDuration);
        }
        if (p.operator == p.treasury || p.operator == p.mediator) {
            revert ProviderRegistryReservedAddress(p.operator);
        }
        operator = p.operator;
        treasury = p.treasury;
        feeBps = p.feeBps;
        minBounty = p.minBounty;
        minDuration = p.minDuration;
        maxDuration = p.maxDuration;
        challengeWindow = p.challengeWindow;
        minCollateralBps = p.minCollateralBps;
        disputeDeposit = p.disputeDeposit;
        mediationWindow = p.mediationWindow;
        reassignDelay = p.reassignDelay;
        emit OperatorChanged(address(0), p.operator);
        emit TreasuryChanged(address(0), p.treasury);
        emit FeeChanged(0, p.feeBps);
        if (p.mediator != address(0)) {
            isListedMediator[p.mediator] = true;
            emit MediatorListed(p.mediator, true);
        }
    }

    // ================================================================ submitter

    /// @notice Fund a job: the ETH sent is the bounty, locked until released or refunded.
    /// @param salt Any value; with the caller and spec it makes the job id, so nobody else can
    ///        take or squat an id the submitter computed in advance.
    /// @param specCid IPFS CID of the job spec (image, dataset, resources).
    /// @param deadline Unix time after which no result is accepted and the bounty is refundable.
    /// @param expectedOperator The operator the submitter trusts to assign the job (and, for an
    ///        on-verify job, to pay it): funding reverts unless it is the one in office.
    /// @param mediator Who may rule on the result: a listed mediator, or the submitter itself
    ///        (providers see it in what they accept). Never the operator.
    /// @param collateral Stake the provider locks while it holds the job, at least
    ///        `minCollateral(bounty)`; a ruling against its result gives it to the submitter.
    /// @param flags `FLAG_ON_VERIFY` lets the operator pay a result at once on its own check,
    ///        `FLAG_SPOT` makes it a spot-checked job; zero for a replicated job.
    /// @param replicas Zero for a single job; 2..MAX_REPLICAS for a replicated job: that many
    ///        seats, each a job of its own with `msg.value / replicas` of the bounty and the same
    ///        terms, for distinct providers (`resolve` pays the seats that agree and slashes the
    ///        others; `collateral` is what each seat's provider locks, at least `minCollateral`
    ///        of a share). Seat i is the job keccak256(abi.encode(id, i)).
    /// @return id keccak256(abi.encode(msg.sender, keccak256(bytes(specCid)), salt)): the job id,
    ///         or the group id of a replicated job.
    function createJob(
        bytes32 salt,
        string calldata specCid,
        uint40 deadline,
        address expectedOperator,
        address mediator,
        uint96 collateral,
        uint8 flags,
        uint8 replicas
    ) external payable returns (bytes32 id) {
        id = _create(
            address(0),
            msg.value,
            minBounty,
            salt,
            specCid,
            deadline,
            expectedOperator,
            mediator,
            collateral,
            flags,
            replicas
        );
    }

    /// @notice Fund a job in an allow-listed ERC-20 `token`: `amount` is pulled from the caller
    ///         with `transferFrom` (approve it first, or call `permitToken` before this in one
    ///         `multicall`). The other arguments are `createJob`'s. Everything
    ///         about the job then moves in `token`: the provider's collateral is locked from its
    ///         stake in `token` (`stakeToken`).
    /// @return id The job id (single) or the group id (replicated), derived as for ETH jobs.
    function createJobWith(
        address token,
        uint256 amount,
        bytes32 salt,
        string calldata specCid,
        uint40 deadline,
        address expectedOperator,
        address mediator,
        uint96 collateral,
        uint8 flags,
        uint8 replicas
    ) external nonReentrant returns (bytes32 id) {
        uint256 least = tokenMinBounty[token];
        if (least == 0) revert JobEscrowTokenNotAllowed(token);
        id = _create(
            token,
            amount,
            least,
            salt,
            specCid,
            deadline,
            expectedOperator,
            mediator,
            collateral,
            flags,
            replicas
        );
        _pull(token, amount);
    }

    /// @notice Let this contract spend `value` of the caller's `token` by an EIP-2612 permit, so
    ///         that `createJobWith`, `stakeToken` or a token `dispute` after it in one
    ///         `multicall` needs no separate approval. A permit someone already used (front-run)
    ///         is fine as long as the allowance is there.
    function permitToken(
        address token,
        uint256 value,
        uint256 permitDeadline,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) external {
        // The permit's own outcome is ignored (a permit front-run by someone else has already
        // set the allowance, and a token without `permit` simply fails); the allowance decides.
        bytes memory call_ = abi.encodeCall(
            IERC20Min.permit, (msg.sender, address(this), value, permitDeadline, v, r, s)
        );
        assembly ("memory-safe") {
            pop(call(gas(), token, 0, add(call_, 0x20), mload(call_), 0, 0))
        }
        uint256 allowance = IERC20Min(token).allowance(msg.sender, address(this));
        if (allowance < value) revert JobEscrowPermitFailed(token, allowance, value);
    }

    /// @dev Funds a job worth `total` in `token` (`least`: the smallest bounty in it): a single
    ///      job (`replicas` zero), or the `replicas` seats of a replicated one, seat i the job
    ///      keccak256(abi.encode(id, i)) with an equal share and the seat count in its flags.
    ///      The one place jobs are funded, so its code is in the contract once.
    /// @return id keccak256(abi.encode(msg.sender, keccak256(bytes(specCid)), salt)).
    function _create(
        address token,
        uint256 total,
        uint256 least,
        bytes32 salt,
        string calldata specCid,
        uint40 deadline,
        address expectedOperator,
        address mediator,
        uint96 collateral,
        uint8 flags,
        uint8 replicas
    ) private returns (bytes32 id) {
        if (expectedOperator != operator) revert JobEscrowOperatorChanged(expectedOperator, operator);
        id = keccak256(abi.encode(msg.sender, keccak256(bytes(specCid)), salt));
        uint96 bounty;
        uint256 n = 1;
        if (replicas == 0) {
            bounty = _bountyOf(_singleAmount(total, flags), 1, least);
        } else {
            if (flags != 0) revert JobEscrowBadFlags(flags);
            if (replicas < 2 || replicas > MAX_REPLICAS) revert JobEscrowBadReplicas(replicas);
            if (total % replicas != 0) revert JobEscrowBountyNotDivisible(total, replicas);
            if (total > type(uint96).max) revert JobEscrowBountyTooHigh(total, type(uint96).max);
            bounty = _bountyOf(total / replicas, replicas, least);
            emit ReplicasCreated(id, msg.sender, replicas, salt);
            flags = replicas << 1;
            n = replicas;
        }
        for (uint256 i; i < n; ++i) {
            // Two calls of `_fund`, not one: called once, via-IR inlines `_fund` here and then
            // `_create` into its three callers (measured: 2,363 bytes more).
            if (replicas == 0) {
                _fund(id, bounty, salt, specCid, deadline, mediator, collateral, flags, token);
            } else {
                // a seat's JobCreated names the group id as its salt
                bytes32 seatId = keccak256(abi.encode(id, i));
                _fund(seatId, bounty, id, specCid, deadline, mediator, collateral, flags, token);
            }
        }
    }

    /// @dev The bounty of a single job funded with `amount` and `flags` (only `FLAG_ON_VERIFY`
    ///      or `FLAG_SPOT`, not both): half the amount for a spot job, whose other half is the
    ///      check deposit.
    function _singleAmount(uint256 amount, uint8 flags) private pure returns (uint256) {
        if (flags == FLAG_SPOT) {
            if (amount % 2 != 0) revert JobEscrowBountyNotDivisible(amount, 2);
            return amount / 2;
        }
        if (flags > FLAG_ON_VERIFY) revert JobEscrowBadFlags(flags);
        return amount;
    }

    /// @dev The bounty (or one seat's share of it) checked against the bounds (`least`: the
    ///      smallest bounty in the job's currency).
    function _bountyOf(uint256 amount, uint256 replicas, uint256 least)
        private
        pure
        returns (uint96)
    {
        if (amount < least) revert JobEscrowBountyTooLow(amount * replicas, least * replicas);
        if (amount > type(uint96).max) revert JobEscrowBountyTooHigh(amount, type(uint96).max);
        return uint96(amount);
    }

    /// @dev Stores a funded job's commitment and emits JobCreated (`salt` is the caller's salt
    ///      for a single job, the group id for a seat).
    function _fund(
        bytes32 jobId,
        uint96 bounty,
        bytes32 salt,
        string calldata specCid,
        uint40 deadline,
        address mediator,
        uint96 collateral,
        uint8 flags,
        address token
    ) private {
        uint256 earliest = block.timestamp + minDuration;
        uint256 latest = block.timestamp + maxDuration;
        if (deadline < earliest || deadline > latest) {
            revert JobEscrowDeadlineOutOfRange(deadline, earliest, latest);
        }
        uint256 len = bytes(specCid).length;
        if (len == 0 || len > MAX_CID_LENGTH) revert JobEscrowBadSpecCid(len);
        uint256 needed = minCollateral(bounty);
        if (collateral < needed) revert JobEscrowCollateralTooLow(collateral, needed);
        if (_jobs[jobId] != 0) revert JobEscrowJobExists(jobId);
        address op = operator;
        if (mediator == op) revert JobEscrowConflictOfInterest(jobId, mediator);
        if (mediator != msg.sender && !isListedMediator[mediator]) {
            revert JobEscrowMediatorNotListed(mediator);
        }

        uint16 fee = feeBps;
        Job memory job = Job(
            msg.sender,
            bounty,
            address(0),
            deadline,
            0,
            fee,
            0,
            0,
            op,
            mediator,
            collateral,
            0,
            flags,
            token,
            0
        );
        _jobs[jobId] = _pack(keccak256(abi.encode(job)), Status.Funded);
        emit JobCreated(
            jobId,
            msg.sender,
            bounty,
            deadline,
            fee,
            op,
            mediator,
            collateral,
            flags,
            token,
            salt,
            specCid
        );
    }

    /// @notice Cancel a job nobody holds; the bounty goes to the submitter's balance. A seat of
    ///         a replicated job is never cancelled alone (another seat may have delivered): the
    ///         submitter cancels the whole group with `resolve` while no seat was assigned.
    function cancel(bytes32 jobId, Job memory job) external {
        _check(jobId, job, Status.Funded);
        if (msg.sender != job.submitter) revert JobEscrowNotSubmitter(msg.sender, job.submitter);
        if (job.flags & FLAG_REPLICAS_MASK != 0) revert JobEscrowReplicated(jobId);
        _finishRefund(jobId, job);
    }

    /// @notice After the deadline with no result pending, return the bounty to the submitter
    ///         (and unlock the collateral of a provider that still holds the job).
    /// @dev Anyone may call it (the operator is not needed); the money only goes to the submitter.
    function refund(bytes32 jobId, Job memory job) external {
        Status status = _checkEither(jobId, job, Status.Funded, Status.Assigned);
        if (block.timestamp <= job.deadline) {
            revert JobEscrowDeadlineNotPassed(jobId, job.deadline, block.timestamp);
        }
        if (status == Status.Assigned) _unlock(job.provider, job.token, job.collateral);
        _finishRefund(jobId, job);
    }

    /// @notice Accept the pending result and pay it now (the submitter), or, for an on-verify
    ///         job, pay it on the operator's check (the job's operator).
    function release(bytes32 jobId, Job memory job) external {
        _check(jobId, job, Status.Submitted);
        if (
            msg.sender != job.submitter
                && (msg.sender != job.operator || job.flags & FLAG_ON_VERIFY == 0)
        ) {
            revert JobEscrowNotAllowed(msg.sender);
        }
        _jobs[jobId] = _pack(_hashCalldata(job), Status.Released);
        _returnCheckDeposit(jobId, job);
        _finishRelease(jobId, job);
    }

    /// @notice Dispute the pending result within the challenge window, depositing
    ///         `depositOf(job)` (ETH sent with the call for an ETH job; for a token job, pulled
    ///         in the token, with no ETH sent): the job's mediator rules on it. A spot job's
    ///         deposit was locked at funding: its submitter or its mediator (a spot check) opens
    ///         the dispute sending nothing.
    function dispute(bytes32 jobId, Job memory job) external payable nonReentrant {
        _check(jobId, job, Status.Submitted);
        bool spot = job.flags & FLAG_SPOT != 0;
        if (msg.sender != job.submitter && (!spot || msg.sender != job.mediator)) {
            revert JobEscrowNotSubmitter(msg.sender, job.submitter);
        }
        if (job.flags & FLAG_REPLICAS_MASK != 0) revert JobEscrowReplicated(jobId);
        uint96 deposit = depositOf(job);
        uint256 sent = job.token == address(0) && !spot ? deposit : 0;
        if (msg.value != sent) revert JobEscrowWrongDeposit(msg.value, sent);
        uint256 closesAt = uint256(job.since) + challengeWindow;
        if (block.timestamp >= closesAt) {
            revert JobEscrowChallengeWindowClosed(jobId, closesAt, block.timestamp);
        }
        uint40 nowTs = uint40(block.timestamp);
        _jobs[jobId] = _pack(
            _hashProgress(job, job.provider, job.since, job.attempt, job.resultDigest, nowTs, 0),
            Status.Disputed
        );
        emit ResultDisputed(jobId, job.provider, nowTs, deposit);
        if (sent == 0 && !spot && deposit != 0) _pull(job.token, deposit);
    }

    // ================================================================ operator

    /// @notice Assign a funded job to `provider`, or reassign an assigned one to another provider
    ///         once its hold is over (`holdUntil`, and at least `reassignDelay`). Only the job's
    ///         operator, only before the deadline, only with the provider's signed acceptance of
    ///         this assignment, the job's terms and `holdFor` (the seconds the provider is given:
    ///         nobody but the provider can take the job back before they pass), and never to the
    ///         operator, the submitter or the mediator. Locks the collateral.
    /// @param id The job's id (`seat` 0), or a replicated job's group id: the job assigned is
    ///        then seat `seat`, keccak256(abi.encode(id, seat)). A wallet holds at most one seat
    ///        of a group, ever (it may take its own seat again), so one wallet cannot vote twice.
    /// @dev Each call is a new attempt, so signatures made for an earlier assignment are void.
    function assign(
        bytes32 id,
        uint256 seat,
        Job memory job,
        address provider,
        uint32 holdFor,
        bytes calldata acceptance
    ) external {
        bytes32 jobId = id;
        if (job.flags & FLAG_REPLICAS_MASK != 0) {
            jobId = keccak256(abi.encode(id, seat));
            uint256 held = _seatOf[id][provider];
            if (held != 0 && held != seat + 1) revert JobEscrowSeatTaken(id, provider);
            _seatOf[id][provider] = seat + 1;
        } else if (seat != 0) {
            revert JobEscrowJobMismatch(id);
        }
        if (msg.sender != job.operator) revert JobEscrowNotOperator(msg.sender, job.operator);
        Status status = _checkEither(jobId, job, Status.Funded, Status.Assigned);
        if (block.timestamp > job.deadline) {
            revert JobEscrowDeadlinePassed(jobId, job.deadline, block.timestamp);
        }
        if (provider == job.provider) revert JobEscrowSameProvider(jobId, provider);
        if (provider == job.operator || provider == job.submitter || provider == job.mediator) {
            revert JobEscrowConflictOfInterest(jobId, provider);
        }
        address signer = _recover(acceptanceDigest(jobId, job, holdFor), acceptance);
        if (signer != provider) revert JobEscrowBadSignature(jobId, signer, provider);
        if (status == Status.Assigned) {
            _requireTakeBackAllowed(jobId, job);
            _unlock(job.provider, job.token, job.collateral);
        }
        _lock(provider, job.token, job.collateral);
        uint16 attempt = job.attempt + 1;
        uint40 nowTs = uint40(block.timestamp);
        uint40 holdUntil = nowTs + holdFor; // < 2**40: a uint40 time plus a uint32
        _jobs[jobId] = _pack(
            _hashProgress(job, provider, nowTs, attempt, 0, 0, holdUntil), Status.Assigned
        );
        emit JobAssigned(jobId, provider, job.provider, attempt, nowTs, holdUntil);
    }

    /// @notice Hand an assigned job back (the provider, at any time) or take it back (the job's
    ///         operator, once the hold is over: `holdUntil`, and at least `reassignDelay` after
    ///         the assignment). It is Funded again, the collateral unlocked, nobody slashed.
    function unassign(bytes32 jobId, Job memory job) external {
        _check(jobId, job, Status.Assigned);
        if (msg.sender == job.operator) {
            _requireTakeBackAllowed(jobId, job);
        } else if (msg.sender != job.provider) {
            revert JobEscrowNotAllowed(msg.sender);
        }
        _unlock(job.provider, job.token, job.collateral);
        _jobs[jobId] =
            _pack(_hashProgress(job, address(0), 0, job.attempt, 0, 0, 0), Status.Funded);
        emit JobUnassigned(jobId, job.provider, job.attempt);
    }

    /// @notice For an on-verify job: relay a result signed by the assigned provider and pay it in
    ///         one transaction, on the operator's own check. Emits ResultSubmitted and
    ///         JobReleased, as the two-step path does, and stores what they fold to.
    function settle(
        bytes32 jobId,
        Job memory job,
        string calldata outputCid,
        bytes calldata signature
    ) external {
        if (msg.sender != job.operator) revert JobEscrowNotOperator(msg.sender, job.operator);
        if (job.flags & FLAG_ON_VERIFY == 0) revert JobEscrowNotOnVerify(jobId);
        _check(jobId, job, Status.Assigned);
        _requireSignedBy(jobId, job, outputCid, signature);
        uint40 submittedAt = _validateResult(jobId, job, outputCid);
        bytes32 digest = keccak256(bytes(outputCid));
        emit ResultSubmitted(jobId, job.provider, job.attempt, submittedAt, outputCid);
        _jobs[jobId] = _pack(
            _hashProgress(job, job.provider, submittedAt, job.attempt, digest, 0, 0),
            Status.Released
        );
        _finishRelease(jobId, job);
    }

    // ================================================================ provider

    /// @notice Deliver the output of an assigned job. Only the assigned provider, once per
    ///         assignment, not after the deadline.
    function submitResult(bytes32 jobId, Job memory job, string calldata outputCid) external {
        _check(jobId, job, Status.Assigned);
        if (msg.sender != job.provider) revert JobEscrowNotProvider(msg.sender, job.provider);
        _acceptResult(jobId, job, outputCid);
    }

    /// @notice Deliver a result signed by the assigned provider (EIP-712 `Result`), paying its gas.
    /// @dev The signature binds job id, attempt, output CID, chain id and this contract; the state
    ///      change makes it single-use. Anyone may relay: the signature is the authority.
    function submitResultFor(
        bytes32 jobId,
        Job memory job,
        string calldata outputCid,
        bytes calldata signature
    ) external {
        _check(jobId, job, Status.Assigned);
        _requireSignedBy(jobId, job, outputCid, signature);
        _acceptResult(jobId, job, outputCid);
    }

    // ================================================================ mediator

    /// @notice The job's mediator rules on the pending result of a job, or of seat `i` of a
    ///         replicated job. Upheld: the result is paid (and a dispute deposit pays the
    ///         mediator). Not upheld: the provider loses the job's collateral and the job is
    ///         Funded again; the submitter gets its deposit back in full (a spot job's stays
    ///         locked for the next attempt), the mediator (when disputed)
    ///         `min(collateral, 2 * deposit)` of the collateral for its re-run and the tie-break
    ///         re-run a mismatch calls for, and the submitter the rest.
    ///         A job: on a dispute at any time until it is finalized, or on the mediator's own
    ///         check within the challenge window. A seat: only where the seats' results hold no
    ///         strict majority (`resolve` settles a majority, and nobody overturns it), once
    ///         every seat has delivered or the deadline has passed (a seat still running may yet
    ///         break the tie), and before `deadline + mediationWindow`.
    /// @param id The job's id, or the replicated job's group id.
    /// @param jobs The job's current struct alone (`i` zero), or every seat's, seat i at index i
    ///        (as for `resolve`).
    /// @param i The job ruled on: index into `jobs`.
    /// @param upheld Whether the result is right.
    function rule(bytes32 id, Job[] memory jobs, uint256 i, bool upheld) external {
        Job memory job = jobs[i];
        bytes32 jobId = id;
        Status status;
        uint256 closesAt;
        if (jobs.length == 1) {
            status = _checkEither(id, job, Status.Submitted, Status.Disputed);
            if (job.flags & FLAG_REPLICAS_MASK != 0) revert JobEscrowReplicated(id);
            closesAt = status == Status.Submitted ? uint256(job.since) + challengeWindow : 2**64;
        } else {
            (bytes32[] memory ids, Status[] memory st,, bool pending,) = _loadSeats(id, jobs);
            jobId = ids[i];
            status = st[i];
            if (status != Status.Submitted) revert JobEscrowWrongStatus(jobId, status);
            (, uint256 agreeing) = _tally(jobs, st);
            if (agreeing * 2 > jobs.length) revert JobEscrowMajority(id);
            uint256 deadline = job.deadline;
            if (pending && block.timestamp <= deadline) {
                revert JobEscrowSeatsPending(id, deadline, block.timestamp);
            }
            closesAt = deadline + mediationWindow;
        }
        if (block.timestamp >= closesAt) {
            revert JobEscrowChallengeWindowClosed(jobId, closesAt, block.timestamp);
        }
        _rule(jobId, job, upheld, status == Status.Disputed);
    }

    function _rule(bytes32 jobId, Job memory job, bool upheld, bool disputed) private {
        if (msg.sender != job.mediator) revert JobEscrowNotMediator(msg.sender, job.mediator);
        uint96 deposit = disputed ? depositOf(job) : 0;
        emit Ruled(jobId, job.mediator, job.provider, job.attempt, upheld);
        if (upheld) {
            _jobs[jobId] = _pack(_hashCalldata(job), Status.Released);
            if (disputed) _creditEvent(jobId, job.mediator, job.token, deposit, "result upheld");
            else _returnCheckDeposit(jobId, job);
            _finishRelease(jobId, job);
            return;
        }
        _jobs[jobId] =
            _pack(_hashProgress(job, address(0), 0, job.attempt, 0, 0, 0), Status.Funded);
        uint96 amount = job.collateral;
        uint96 toMediator;
        if (disputed) {
            // the liar pays the mediator's re-run and its tie-break: up to two deposits' worth
            uint256 cap = 2 * uint256(deposit);
            toMediator = amount < cap ? amount : uint96(cap);
            // a spot job's check deposit stays locked for its next attempt
            if (job.flags & FLAG_SPOT == 0) {
                _creditEvent(jobId, job.submitter, job.token, deposit, "deposit returned");
            }
        }
        _slashLocked(job.provider, job.token, amount);
        emit ProviderSlashed(job.provider, jobId, amount, job.submitter, toMediator);
        if (toMediator != 0) _credit(job.mediator, job.token, toMediator);
        _credit(job.submitter, job.token, amount - toMediator);
    }

    // ================================================================ anyone

    /// @notice Settle the seats of a replicated job (anyone may call it; the money only goes to
    ///         the seats' providers, the treasury and the submitter). Once every seat has a
    ///         result, or the deadline has passed: when the results of a strict majority of the
    ///         k seats (a seat already paid counts for its result; every seat has a provider of
    ///         its own, `assign`) agree, the agreeing seats are paid, each seat whose result disagrees is
    ///         refunded and its provider loses the seat's collateral to the submitter, and a seat
    ///         without a result is refunded (its provider unlocked, not slashed). Without a
    ///         majority it waits for the mediator's rulings on the seats (`rule`) until
    ///         `deadline + mediationWindow`; then every open seat is refunded, nobody slashed.
    ///         While every seat is Funded (none held, none delivered) the submitter may resolve
    ///         at once: every seat is refunded (it cancels the replicated job).
    /// @param seats The seats' current structs, seat i at index i (k = seats.length).
    function resolve(bytes32 groupId, Job[] memory seats) external {
        (bytes32[] memory ids, Status[] memory st, bool open, bool pending, bool held) =
            _loadSeats(groupId, seats);
        uint256 k = seats.length;
        if (!open) revert JobEscrowWrongStatus(ids[0], st[0]);
        (bytes32 win, uint256 agreeing) = _tally(seats, st);
        bool majority = agreeing * 2 > k;
        uint256 deadline = seats[0].deadline;
        if (!majority) {
            uint256 at = deadline + mediationWindow;
            if (block.timestamp < at && (held || msg.sender != seats[0].submitter)) {
                revert JobEscrowNoMajority(groupId, at, block.timestamp);
            }
            win = bytes32(0);
            agreeing = 0;
        } else if (pending && block.timestamp <= deadline) {
            revert JobEscrowSeatsPending(groupId, deadline, block.timestamp);
        }
        emit Resolved(groupId, win, uint8(agreeing), uint8(k));
        for (uint256 i; i < k; ++i) {
            Job memory seat = seats[i];
            Status s = st[i];
            if (s == Status.Submitted && majority) {
                if (seat.resultDigest != win) {
                    uint96 amount = seat.collateral;
                    _slashLocked(seat.provider, seat.token, amount);
                    emit ProviderSlashed(seat.provider, ids[i], amount, seat.submitter, 0);
                    _credit(seat.submitter, seat.token, amount);
                    _finishRefund(ids[i], seat);
                } else {
                    _jobs[ids[i]] = _pack(_hashCalldata(seat), Status.Released);
                    _finishRelease(ids[i], seat);
                }
            } else if (s == Status.Submitted || s == Status.Assigned) {
                _unlock(seat.provider, seat.token, seat.collateral);
                _finishRefund(ids[i], seat);
            } else if (s == Status.Funded) {
                _finishRefund(ids[i], seat);
            }
        }
    }

    /// @notice Pay a result nobody objected to: a submitted one once the challenge window has
    ///         passed, or a disputed one the mediator left unruled for `mediationWindow` (the
    ///         result stands, the deposit goes back to the submitter). Anyone may call it; the
    ///         money only goes to the provider (and the fee to the treasury).
    function finalize(bytes32 jobId, Job memory job) external {
        Status status = _checkEither(jobId, job, Status.Submitted, Status.Disputed);
        if (job.flags & FLAG_REPLICAS_MASK != 0) revert JobEscrowReplicated(jobId);
        uint256 allowedAt = status == Status.Submitted
            ? uint256(job.since) + challengeWindow
            : uint256(job.disputedAt) + mediationWindow;
        if (block.timestamp < allowedAt) {
            revert JobEscrowChallengeWindowOpen(jobId, allowedAt, block.timestamp);
        }
        _jobs[jobId] = _pack(_hashCalldata(job), Status.Released);
        if (status == Status.Disputed) {
            _creditEvent(
                jobId, job.submitter, job.token, depositOf(job), "deposit returned: no ruling"
            );
        } else {
            _returnCheckDeposit(jobId, job);
        }
        _finishRelease(jobId, job);
    }

    /// @notice Credit the fees accrued so far to the treasury's withdrawable balance. Anyone
    ///         may call it; the money only goes to the treasury.
    function collectFees() external {
        uint256 amount = feesAccrued;
        if (amount == 0) revert JobEscrowNothingToWithdraw(treasury);
        feesAccrued = 0;
        address to = treasury;
        emit FeesCollected(to, address(0), amount);
        _credit(to, address(0), amount);
    }

    /// @notice `collectFees` for the fees accrued in `token`.
    function collectTokenFees(address token) external {
        uint256 amount = tokenFeesAccrued[token];
        address to = treasury;
        if (amount == 0) revert JobEscrowNothingToWithdraw(to);
        tokenFeesAccrued[token] = 0;
        emit FeesCollected(to, token, amount);
        _credit(to, token, amount);
    }

    // ================================================================ money out

    /// @notice Send the caller's whole withdrawable balance to itself.
    function withdraw() external {
        _withdraw(payable(msg.sender));
    }

    /// @notice Send the caller's whole withdrawable balance to `to` (for wallets that cannot
    ///         receive ETH themselves).
    function withdrawTo(address payable to) external {
        if (to == address(0)) revert JobEscrowZeroAddress();
        _withdraw(to);
    }

    /// @notice Send the caller's whole balance in `token` to `to` (any token it holds a balance
    ///         in, listed or no longer listed).
    function withdrawToken(address token, address to) external nonReentrant {
        if (to == address(0) || token == address(0)) revert JobEscrowZeroAddress();
        uint256 amount = _tokenBalances[msg.sender][token];
        if (amount == 0) revert JobEscrowNothingToWithdraw(msg.sender);
        _tokenBalances[msg.sender][token] = 0;
        emit Withdrawn(msg.sender, token, to, amount);
        _callToken(token, abi.encodeCall(IERC20Min.transfer, (to, amount)));
    }

    // ================================================================ batching
    // `multicall(bytes[])` (OpenZeppelin `Multicall`): several calls of this contract in one
    // transaction, in order, each a delegatecall with the caller's identity, so each call's
    // checks are its own (only a job's operator passes its operator checks). If any call
    // reverts, the whole batch reverts with that call's error. It is non-payable: inside a
    // batch `msg.value` is always 0, so one deposit cannot be counted by several payable calls
    // (`createJob`, `dispute`, `stake`), which refuse the missing ETH by their own checks. The
    // transient reentrancy guard is the same slot inside and outside a batch, and no function
    // but the withdrawals hands control to anyone (pull payments), so a receiver re-entering
    // through `multicall` meets the guard (docs/contracts.md).

    /// @notice As `multicall`, but a call that reverts is skipped, not fatal: `ok[i]` says
    ///         whether call i took effect. For batches of steps someone else may do first (a
    ///         provider relaying its own result ahead of the operator's settle).
    function tryMulticall(bytes[] calldata data) external returns (bool[] memory ok) {
        ok = new bool[](data.length);
        for (uint256 i; i < data.length; ++i) {
            (ok[i],) = address(this).delegatecall(data[i]);
        }
    }

    // ================================================================ admin

    /// @dev The owner's checks keep this contract's error (`JobEscrowNotOwner`); the two-step
    ///      hand-over (`transferOwnership`, `acceptOwnership`, `pendingOwner`) and
    ///      `renounceOwnership` (settings frozen for good; funded jobs go on) are OpenZeppelin's.
    function _checkOwner() internal view override {
        if (msg.sender != owner()) revert JobEscrowNotOwner(msg.sender);
    }

    /// @notice Change the operator for jobs funded from now on; funded jobs keep theirs. A
    ///         registered provider, the treasury or a listed mediator cannot be the operator.
    function setOperator(address newOperator) external onlyOwner {
        if (newOperator == address(0)) revert JobEscrowZeroAddress();
        if (
            _providers[newOperator].registered || newOperator == treasury
                || isListedMediator[newOperator]
        ) revert ProviderRegistryReservedAddress(newOperator);
        emit OperatorChanged(operator, newOperator);
        operator = newOperator;
    }

    /// @notice Change where future fees are credited. Fees already credited stay with the old
    ///         one. A registered provider or the operator cannot be the treasury.
    function setTreasury(address newTreasury) external onlyOwner {
        if (newTreasury == address(0)) revert JobEscrowZeroAddress();
        if (_providers[newTreasury].registered || newTreasury == operator) {
            revert ProviderRegistryReservedAddress(newTreasury);
        }
        emit TreasuryChanged(treasury, newTreasury);
        treasury = newTreasury;
    }

    /// @notice Change the fee for jobs created from now on (at most MAX_FEE_BPS).
    function setFeeBps(uint16 newFeeBps) external onlyOwner {
        if (newFeeBps > MAX_FEE_BPS) revert JobEscrowFeeTooHigh(newFeeBps, MAX_FEE_BPS);
        emit FeeChanged(feeBps, newFeeBps);
        feeBps = newFeeBps;
    }

    /// @notice Allow an ERC-20 token for jobs funded and stakes added from now on, with the
    ///         smallest bounty in its units (`minBountyInToken`), or disallow it (zero); jobs
    ///         funded in it, stakes and balances in it are unaffected. List only plain tokens: a
    ///         fee-on-transfer token is refused at every transfer anyway, but a rebasing token
    ///         would break the solvency of balances held in it (docs/contracts.md).
    function setToken(address token, uint256 minBountyInToken) external onlyOwner {
        if (token == address(0)) revert JobEscrowZeroAddress();
        tokenMinBounty[token] = minBountyInToken;
        emit TokenListed(token, minBountyInToken);
    }

    /// @notice List or unlist a mediator submitters may name from now on; jobs already funded
    ///         keep the mediator they named. The operator cannot be listed.
    function setMediator(address mediator, bool listed) external onlyOwner {
        if (mediator == address(0)) revert JobEscrowZeroAddress();
        if (listed && mediator == operator) revert ProviderRegistryReservedAddress(mediator);
        isListedMediator[mediator] = listed;
        emit MediatorListed(mediator, listed);
    }

    // ================================================================ views

    /// @notice The status of a job (None if unknown).
    function statusOf(bytes32 jobId) external view returns (Status) {
        return _statusOf(jobId);
    }

    /// @notice Whether `job` is the current state of `jobId`.
    function isCurrent(bytes32 jobId, Job memory job) external view returns (bool) {
        uint256 slot = _jobs[jobId];
        return slot != 0 && slot == _pack(_hashCalldata(job), Status(uint8(slot)));
    }

    /// @notice Withdrawable ETH balance of `account`.
    function balanceOf(address account) external view returns (uint256) {
        return _balances[account];
    }

    /// @notice Withdrawable balance of `account` in `token` (zero: ETH).
    function balanceOfToken(address account, address token) external view returns (uint256) {
        return token == address(0) ? _balances[account] : _tokenBalances[account][token];
    }

    /// @notice What disputing `job`'s result deposits: the job's bounty (the price of the
    ///         mediator's re-run, which is funded at the disputed job's own bounty), in its
    ///         token; for an ETH job at least `disputeDeposit` wei. Whoever the ruling finds wrong
    ///         pays the re-run: upheld, the deposit goes to the mediator; ruled wrong, the
    ///         deposit comes back in full and the mediator takes at most the deposit's worth of
    ///         the slashed collateral, the rest going to the submitter (`rule`).
    function depositOf(Job memory job) public view returns (uint96) {
        uint96 floor = job.token == address(0) && job.flags & FLAG_SPOT == 0 ? disputeDeposit : 0;
        return job.bounty < floor ? floor : job.bounty;
    }

    /// @notice The least collateral a job with this bounty may ask for.
    function minCollateral(uint256 bounty) public view returns (uint256) {
        return (bounty * minCollateralBps) / 10_000;
    }

    /// @notice The EIP-712 digest a provider signs to have `outputCid` relayed for `jobId`.
    function resultDigest(bytes32 jobId, uint16 attempt, string calldata outputCid)
        internal
        view
        returns (bytes32)
    {
        bytes32 structHash =
            keccak256(abi.encode(RESULT_TYPEHASH, jobId, attempt, keccak256(bytes(outputCid))));
        return _hashTypedDataV4(structHash);
    }

    /// @notice The EIP-712 digest a provider signs to accept the next assignment of `jobId`
    ///         (attempt `job.attempt + 1`) on the terms in `job`, given `holdFor` seconds.
    function acceptanceDigest(bytes32 jobId, Job memory job, uint32 holdFor)
        internal
        view
        returns (bytes32)
    {
        bytes32 structHash = keccak256(
            abi.encode(
                ACCEPTANCE_TYPEHASH,
                jobId,
                job.attempt + 1,
                job.bounty,
                job.feeBps,
                job.deadline,
                job.collateral,
                job.mediator,
                job.flags,
                job.token,
                holdFor
            )
        );
        return _hashTypedDataV4(structHash);
    }

    // ================================================================ internals

    /// @dev Checks `seats` against the stored seats of `groupId` (all k of them, in order) and
    ///      returns their ids and statuses; `open`: some seat is not final, `pending`: some seat
    ///      has no result yet (Funded or Assigned), `held`: some seat is not Funded.
    function _loadSeats(bytes32 groupId, Job[] memory seats)
        private
        view
        returns (bytes32[] memory ids, Status[] memory st, bool open, bool pending, bool held)
    {
        uint256 k = seats.length;
        if (k < 2 || k > MAX_REPLICAS) revert JobEscrowBadReplicas(k);
        ids = new bytes32[](k);
        st = new Status[](k);
        for (uint256 i; i < k; ++i) {
            ids[i] = keccak256(abi.encode(groupId, i));
            Job memory seat = seats[i];
            if (uint256(seat.flags & FLAG_REPLICAS_MASK) >> 1 != k) {
                revert JobEscrowBadReplicas(uint256(seat.flags & FLAG_REPLICAS_MASK) >> 1);
            }
            uint256 slot = _jobs[ids[i]];
            Status s = Status(uint8(slot));
            if (s == Status.None || slot != _pack(_hashCalldata(seat), s)) {
                revert JobEscrowJobMismatch(ids[i]);
            }
            st[i] = s;
            if (s == Status.Submitted || s == Status.Disputed) open = true;
            if (s == Status.Funded || s == Status.Assigned) pending = open = true;
            if (s != Status.Funded) held = true;
        }
    }

    /// @dev The result digest with the most seats among the seats that voted (Submitted, or
    ///      Released: already paid), and that count. Each seat's provider is distinct (`assign`
    ///      gives a wallet at most one seat of a group), so a seat is a vote.
    function _tally(Job[] memory seats, Status[] memory st)
        private
        pure
        returns (bytes32 best, uint256 bestCount)
    {
        uint256 k = seats.length;
        for (uint256 i; i < k; ++i) {
            if (!_votes(st[i])) continue;
            bytes32 d = seats[i].resultDigest;
            uint256 c;
            for (uint256 m; m < k; ++m) {
                if (_votes(st[m]) && seats[m].resultDigest == d) {
                    ++c;
                }
            }
            if (c > bestCount) {
                bestCount = c;
                best = d;
            }
        }
    }

    function _votes(Status s) private pure returns (bool) {
        return s == Status.Submitted || s == Status.Released;
    }

    /// @dev The operator may take a job back from its provider only once the time the provider
    ///      signed for is over (`holdUntil`), and at least `reassignDelay` after the assignment,
    ///      so it cannot grab a result it has seen before the provider posts it.
    function _requireTakeBackAllowed(bytes32 jobId, Job memory job) private view {
        uint256 allowedAt = uint256(job.since) + reassignDelay;
        if (job.holdUntil > allowedAt) allowedAt = job.holdUntil;
        if (block.timestamp < allowedAt) revert JobEscrowTooEarly(jobId, allowedAt, block.timestamp);
    }

    /// @dev Records a result for the two-step path (release, finalize or a ruling follows).
    function _acceptResult(bytes32 jobId, Job memory job, string calldata outputCid) private {
        uint40 submittedAt = _validateResult(jobId, job, outputCid);
        _jobs[jobId] = _pack(
            _hashProgress(
                job, job.provider, submittedAt, job.attempt, keccak256(bytes(outputCid)), 0, 0
            ),
            Status.Submitted
        );
        emit ResultSubmitted(jobId, job.provider, job.attempt, submittedAt, outputCid);
    }

    function _validateResult(bytes32 jobId, Job memory job, string calldata outputCid)
        private
        view
        returns (uint40)
    {
        if (block.timestamp > job.deadline) {
            revert JobEscrowDeadlinePassed(jobId, job.deadline, block.timestamp);
        }
        uint256 len = bytes(outputCid).length;
        if (len == 0 || len > MAX_CID_LENGTH) revert JobEscrowBadOutputCid(len);
        return uint40(block.timestamp);
    }

    function _requireSignedBy(
        bytes32 jobId,
        Job memory job,
        string calldata outputCid,
        bytes calldata signature
    ) private view {
        address signer = _recover(resultDigest(jobId, job.attempt, outputCid), signature);
        if (signer != job.provider) revert JobEscrowBadSignature(jobId, signer, job.provider);
    }

    /// @dev Pays a job whose status the caller has just moved to Released (effects first) and
    ///      unlocks its collateral.
    function _finishRelease(bytes32 jobId, Job memory job) private {
        // bounty < 2**96 and feeBps <= 2000, so bounty * feeBps < 2**107: no overflow, and
        // fee <= bounty, so the subtraction cannot underflow.
        uint96 fee;
        uint96 payout;
        unchecked {
            fee = uint96((uint256(job.bounty) * job.feeBps) / 10_000);
            payout = job.bounty - fee;
        }
        _unlock(job.provider, job.token, job.collateral);
        _credit(job.provider, job.token, payout);
        if (fee != 0) {
            if (job.token != address(0)) {
                tokenFeesAccrued[job.token] += fee;
            } else {
                uint256 accrued = uint256(feesAccrued) + fee;
                if (accrued > type(uint96).max) {
                    _credit(treasury, address(0), fee); // the accumulator is full: credit directly
                } else {
                    feesAccrued = uint96(accrued);
                }
            }
        }
        emit JobReleased(jobId, job.provider, job.submitter, payout, fee);
    }

    function _finishRefund(bytes32 jobId, Job memory job) private {
        _jobs[jobId] = _pack(_hashCalldata(job), Status.Refunded);
        _credit(job.submitter, job.token, job.bounty);
        emit JobRefunded(jobId, job.submitter, job.bounty);
        _returnCheckDeposit(jobId, job);
    }

    /// @dev A spot job ending without a dispute it funds: its check deposit goes back.
    function _returnCheckDeposit(bytes32 jobId, Job memory job) private {
        if (job.flags & FLAG_SPOT != 0) {
            _creditEvent(jobId, job.submitter, job.token, job.bounty, "check deposit returned");
        }
    }

    function _creditEvent(
        bytes32 jobId,
        address account,
        address token,
        uint96 amount,
        string memory reason
    ) private {
        emit Credited(jobId, account, amount, reason);
        _credit(account, token, amount);
    }

    function _withdraw(address payable to) private nonReentrant {
        uint256 amount = _balances[msg.sender];
        if (amount == 0) revert JobEscrowNothingToWithdraw(msg.sender);
        _balances[msg.sender] = 0;
        emit Withdrawn(msg.sender, address(0), to, amount);
        (bool ok,) = to.call{value: amount}("");
        if (!ok) revert JobEscrowWithdrawFailed(to, amount);
    }

    function _credit(address account, address token, uint256 amount) internal override {
        // Total credits are bounded by what this contract ever received of the token (< 2**256).
        unchecked {
            if (token == address(0)) _balances[account] += amount;
            else _tokenBalances[account][token] += amount;
        }
    }

    function _isReserved(address account) internal view override returns (bool) {
        return account == operator || account == treasury;
    }

    /// @dev Revert unless `jobId` is in `expected` status and `job` is its current state.
    function _check(bytes32 jobId, Job memory job, Status expected) private view {
        uint256 slot = _jobs[jobId];
        Status status = Status(uint8(slot));
        if (status != expected) revert JobEscrowWrongStatus(jobId, status);
        if (slot != _pack(_hashCalldata(job), status)) revert JobEscrowJobMismatch(jobId);
    }

    /// @dev As `_check`, accepting either of two statuses; returns the one found.
    function _checkEither(bytes32 jobId, Job memory job, Status a, Status b)
        private
        view
        returns (Status status)
    {
        uint256 slot = _jobs[jobId];
        status = Status(uint8(slot));
        if (status != a && status != b) revert JobEscrowWrongStatus(jobId, status);
        if (slot != _pack(_hashCalldata(job), status)) revert JobEscrowJobMismatch(jobId);
    }

    function _statusOf(bytes32 jobId) private view returns (Status) {
        return Status(uint8(_jobs[jobId]));
    }

    /// @dev The storage word for a job: its hash with the low byte replaced by the status
    ///      (a job's word is never zero, since every stored status is >= Funded).
    function _pack(bytes32 hash, Status status) private pure returns (uint256) {
        return (uint256(hash) & ~uint256(0xff)) | uint256(uint8(status));
    }

    /// @dev keccak256(abi.encode(job)): `Job` is a static struct of 15 words, so its memory
    ///      image is its ABI encoding. The ABI decoder that copied it from calldata refused any
    ///      non-canonical word (dirty high bits), so the hash is the commitment's or a mismatch.
    function _hashCalldata(Job memory job) private pure returns (bytes32 h) {
        assembly ("memory-safe") {
            h := keccak256(job, _JOB_BYTES)
        }
    }

    /// @dev keccak256(abi.encode(job)) with the progress fields (provider, since, attempt,
    ///      resultDigest, disputedAt, holdUntil) replaced; the terms never change. `job` is left
    ///      as it was.
    function _hashProgress(
        Job memory job,
        address provider,
        uint40 since,
        uint16 attempt,
        bytes32 digest,
        uint40 disputedAt,
        uint40 holdUntil
    ) private pure returns (bytes32 h) {
        assembly ("memory-safe") {
            let p := mload(0x40)
            mcopy(p, job, _JOB_BYTES)
            mstore(add(p, 0x40), provider)
            mstore(add(p, 0x80), since)
            mstore(add(p, 0xc0), attempt)
            mstore(add(p, 0xe0), digest)
            mstore(add(p, 0x160), disputedAt)
            mstore(add(p, 0x1c0), holdUntil)
            h := keccak256(p, _JOB_BYTES)
        }
    }

    /// @dev The signer of `digest`, or zero for a signature that is not 65 bytes, has a
    ///      malleable high `s`, a bad `v` or recovers nobody (OpenZeppelin `ECDSA.tryRecover`).
    function _recover(bytes32 digest, bytes calldata signature) private pure returns (address) {
        (address signer,,) = ECDSA.tryRecoverCalldata(digest, signature);
        return signer;
    }
}
