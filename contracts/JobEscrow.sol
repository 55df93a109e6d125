// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {IJobEscrow} from "./IJobEscrow.sol";
import {ProviderRegistry} from "./ProviderRegistry.sol";

/// @title JobEscrow
/// @notice Per-job escrow for the GridMarket GPU compute marketplace.
///
/// A submitter locks a bounty with `createJob`. Only the operator (the scheduler's key) assigns
/// the job, and only to an eligible registered provider. Only that provider can author a result,
/// once per assignment and before the deadline, by sending it or by signing it (EIP-712) for a
/// relayer. The bounty is released, minus the fee fixed at creation, by the operator after
/// verification or by the submitter accepting; if nobody rejects within the challenge window the
/// provider claims it alone. After the deadline with no result, anyone can refund the submitter.
/// Money only moves into withdrawable balances (pull payments); `withdraw` is the one place ETH
/// leaves, guarded against reentrancy, so a reverting receiver can only block itself.
///
/// @dev Storage holds one slot per job: keccak256(abi.encode(Job)) with the low byte replaced by
///      the status. See docs/contracts.md for the gas reasoning and the invariants.
contract JobEscrow is ProviderRegistry {
    /// @notice Highest platform fee the owner can ever set: 20%.
    uint16 public constant MAX_FEE_BPS = 2000;
    /// @notice Longest accepted CID string (CIDv1 base32 sha2-256 is 59 characters).
    uint256 public constant MAX_CID_LENGTH = 128;
    /// @notice EIP-712 type of a provider's result.
    bytes32 public constant RESULT_TYPEHASH =
        keccak256("Result(bytes32 jobId,uint16 attempt,string outputCid)");
    bytes32 private constant _DOMAIN_TYPEHASH = keccak256(
        "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
    );
    bytes32 private constant _NAME_HASH = keccak256("GridMarket JobEscrow");
    bytes32 private constant _VERSION_HASH = keccak256("1");
    /// @dev secp256k1n / 2: signatures with a higher s are malleable copies and are refused.
    uint256 private constant _HALF_N =
        0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0;

    /// @notice Smallest bounty accepted, in wei.
    uint96 public immutable minBounty;
    /// @notice Shortest time from creation to deadline, in seconds.
    uint40 public immutable minDuration;
    /// @notice Longest time from creation to deadline, in seconds.
    uint40 public immutable maxDuration;
    /// @notice Seconds after a result during which the operator may reject it; then the provider
    ///         may claim the bounty without anyone's help.
    uint40 public immutable challengeWindow;

    uint256 private immutable _cachedChainId;
    bytes32 private immutable _cachedDomainSeparator;

    /// @notice Current owner (admin of operator, treasury and fee; never of funds).
    address public owner;
    /// @notice Proposed owner, until it accepts.
    address public pendingOwner;
    /// @notice The scheduler's key: assigns, unassigns, settles, releases and rejects.
    address public operator;
    /// @notice Fees released but not yet credited to the treasury (`collectFees`).
    /// @dev Packed with `operator`: a release reads that slot anyway to authorize the caller.
    uint96 public feesAccrued;
    /// @notice Receives platform fees (into its withdrawable balance, via `collectFees`).
    address public treasury;
    /// @notice Fee for jobs created from now on, in basis points of the bounty.
    uint16 public feeBps;

    mapping(bytes32 jobId => uint256) private _jobs;
    mapping(address account => uint256) private _balances;

    bool private transient _locked;

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
        uint16 slashBps;
    }

    modifier onlyOwner() {
        if (msg.sender != owner) revert JobEscrowNotOwner(msg.sender);
        _;
    }

    modifier onlyOperator() {
        if (msg.sender != operator) revert JobEscrowNotOperator(msg.sender);
        _;
    }

    modifier nonReentrant() {
        if (_locked) revert JobEscrowReentrancy();
        _locked = true;
        _;
        _locked = false;
    }

    /// @param p Deployment parameters; the deployer becomes the owner.
    constructor(Params memory p) ProviderRegistry(p.minStake, p.unstakeDelay, p.slashBps) {
        if (p.operator == address(0) || p.treasury == address(0)) revert JobEscrowZeroAddress();
        if (p.feeBps > MAX_FEE_BPS) revert JobEscrowFeeTooHigh(p.feeBps, MAX_FEE_BPS);
        if (p.minDuration > p.maxDuration) {
            revert JobEscrowDeadlineOutOfRange(p.minDuration, 0, p.maxDuration);
        }
        owner = msg.sender;
        operator = p.operator;
        treasury = p.treasury;
        feeBps = p.feeBps;
        minBounty = p.minBounty;
        minDuration = p.minDuration;
        maxDuration = p.maxDuration;
        challengeWindow = p.challengeWindow;
        _cachedChainId = block.chainid;
        _cachedDomainSeparator = _buildDomainSeparator();
        emit OwnershipTransferred(address(0), msg.sender);
        emit OperatorChanged(address(0), p.operator);
        emit TreasuryChanged(address(0), p.treasury);
        emit FeeChanged(0, p.feeBps);
    }

    // ================================================================ submitter

    /// @notice Fund a job: the ETH sent is the bounty, locked until released or refunded.
    /// @param salt Any value; with the caller and spec it makes the job id, so nobody else can
    ///        take or squat an id the submitter computed in advance.
    /// @param specCid IPFS CID of the job spec (image, dataset, resources).
    /// @param deadline Unix time after which no result is accepted and the bounty is refundable.
    /// @return jobId keccak256(abi.encode(msg.sender, keccak256(bytes(specCid)), salt)).
    function createJob(bytes32 salt, string calldata specCid, uint40 deadline)
        external
        payable
        returns (bytes32 jobId)
    {
        if (msg.value < minBounty) revert JobEscrowBountyTooLow(msg.value, minBounty);
        if (msg.value > type(uint96).max) {
            revert JobEscrowBountyTooHigh(msg.value, type(uint96).max);
        }
        uint256 earliest = block.timestamp + minDuration;
        uint256 latest = block.timestamp + maxDuration;
        if (deadline < earliest || deadline > latest) {
            revert JobEscrowDeadlineOutOfRange(deadline, earliest, latest);
        }
        uint256 len = bytes(specCid).length;
        if (len == 0 || len > MAX_CID_LENGTH) revert JobEscrowBadSpecCid(len);

        jobId = keccak256(abi.encode(msg.sender, keccak256(bytes(specCid)), salt));
        if (_jobs[jobId] != 0) revert JobEscrowJobExists(jobId);

        uint16 fee = feeBps;
        Job memory job = Job(msg.sender, uint96(msg.value), address(0), deadline, 0, fee, 0, 0);
        _jobs[jobId] = _pack(keccak256(abi.encode(job)), Status.Funded);
        emit JobCreated(jobId, msg.sender, uint96(msg.value), deadline, fee, salt, specCid);
    }

    /// @notice Cancel a job nobody was assigned yet; the bounty goes to the submitter's balance.
    function cancel(bytes32 jobId, Job calldata job) external {
        _check(jobId, job, Status.Funded);
        if (msg.sender != job.submitter) revert JobEscrowNotSubmitter(msg.sender, job.submitter);
        _finishRefund(jobId, job);
    }

    /// @notice After the deadline with no result pending, return the bounty to the submitter.
    /// @dev Anyone may call it (the operator is not needed); the money only goes to the submitter.
    function refund(bytes32 jobId, Job calldata job) external {
        _checkEither(jobId, job, Status.Funded, Status.Assigned);
        if (block.timestamp <= job.deadline) {
            revert JobEscrowDeadlineNotPassed(jobId, job.deadline, block.timestamp);
        }
        _finishRefund(jobId, job);
    }

    // ================================================================ operator

    /// @notice Assign a funded job to `provider`, or reassign an assigned one to another provider.
    /// @dev Only before the deadline, only to an eligible provider; each call is a new attempt,
    ///      so signatures made for an earlier assignment are void.
    function assign(bytes32 jobId, Job calldata job, address provider) external onlyOperator {
        _checkEither(jobId, job, Status.Funded, Status.Assigned);
        if (block.timestamp > job.deadline) {
            revert JobEscrowDeadlinePassed(jobId, job.deadline, block.timestamp);
        }
        if (provider == job.provider) revert JobEscrowSameProvider(jobId, provider);
        _requireEligible(provider);
        uint16 attempt = job.attempt + 1;
        _jobs[jobId] = _pack(_hashWith(job, provider, 0, attempt, 0), Status.Assigned);
        emit JobAssigned(jobId, provider, job.provider, attempt);
    }

    /// @notice Take an assigned job back (the provider lost its lease); it is Funded again.
    function unassign(bytes32 jobId, Job calldata job) external onlyOperator {
        _check(jobId, job, Status.Assigned);
        _jobs[jobId] = _pack(_hashWith(job, address(0), 0, job.attempt, 0), Status.Funded);
        emit JobUnassigned(jobId, job.provider, job.attempt);
    }

    /// @notice Reject a submitted result within the challenge window: the provider is slashed
    ///         (to the submitter) and the job goes back to Funded to be assigned again.
    function reject(bytes32 jobId, Job calldata job) external onlyOperator {
        _check(jobId, job, Status.Submitted);
        uint256 closesAt = uint256(job.submittedAt) + challengeWindow;
        if (block.timestamp >= closesAt) {
            revert JobEscrowChallengeWindowClosed(jobId, closesAt, block.timestamp);
        }
        _jobs[jobId] = _pack(_hashWith(job, address(0), 0, job.attempt, 0), Status.Funded);
        uint96 slashed = _slash(job.provider, jobId, job.submitter);
        emit ResultRejected(jobId, job.provider, job.attempt, slashed);
    }

    /// @notice Relay a result signed by the assigned provider and pay it in one transaction:
    ///         the scheduler's path once it has verified the output off-chain. Emits
    ///         ResultSubmitted and JobReleased, as the two-step path does.
    function settle(
        bytes32 jobId,
        Job calldata job,
        string calldata outputCid,
        bytes calldata signature
    ) external onlyOperator {
        _check(jobId, job, Status.Assigned);
        _requireSignedBy(jobId, job, outputCid, signature);
        uint40 submittedAt = _validateResult(jobId, job, outputCid);
        emit ResultSubmitted(jobId, job.provider, job.attempt, submittedAt, outputCid);
        _jobs[jobId] = _pack(_hashCalldata(job), Status.Released);
        _finishRelease(jobId, job);
    }

    // ================================================================ provider

    /// @notice Deliver the output of an assigned job. Only the assigned provider, once per
    ///         assignment, not after the deadline.
    function submitResult(bytes32 jobId, Job calldata job, string calldata outputCid) external {
        _check(jobId, job, Status.Assigned);
        if (msg.sender != job.provider) revert JobEscrowNotProvider(msg.sender, job.provider);
        _acceptResult(jobId, job, outputCid);
    }

    /// @notice Deliver a result signed by the assigned provider (EIP-712 `Result`), paying its gas.
    /// @dev The signature binds job id, attempt, output CID, chain id and this contract; the state
    ///      change makes it single-use. Anyone may relay: the signature is the authority.
    function submitResultFor(
        bytes32 jobId,
        Job calldata job,
        string calldata outputCid,
        bytes calldata signature
    ) external {
        _check(jobId, job, Status.Assigned);
        _requireSignedBy(jobId, job, outputCid, signature);
        _acceptResult(jobId, job, outputCid);
    }

    /// @notice Once the challenge window passed with no rejection, the provider takes its pay.
    function claim(bytes32 jobId, Job calldata job) external {
        _check(jobId, job, Status.Submitted);
        if (msg.sender != job.provider) revert JobEscrowNotProvider(msg.sender, job.provider);
        uint256 claimableAt = uint256(job.submittedAt) + challengeWindow;
        if (block.timestamp < claimableAt) {
            revert JobEscrowChallengeWindowOpen(jobId, claimableAt, block.timestamp);
        }
        _jobs[jobId] = _pack(_hashCalldata(job), Status.Released);
        _finishRelease(jobId, job);
    }

    // ================================================================ operator or submitter

    /// @notice Pay a submitted result: by the operator after verification, or by the submitter
    ///         accepting it (at any time before it is rejected).
    function release(bytes32 jobId, Job calldata job) external {
        _check(jobId, job, Status.Submitted);
        if (msg.sender != operator && msg.sender != job.submitter) {
            revert JobEscrowNotAllowed(msg.sender);
        }
        _jobs[jobId] = _pack(_hashCalldata(job), Status.Released);
        _finishRelease(jobId, job);
    }

    /// @notice Credit the fees accrued so far to the treasury's withdrawable balance. Anyone
    ///         may call it; the money only goes to the treasury.
    function collectFees() external {
        uint256 amount = feesAccrued;
        if (amount == 0) revert JobEscrowNothingToWithdraw(treasury);
        feesAccrued = 0;
        address to = treasury;
        emit FeesCollected(to, amount);
        _credit(to, amount);
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

    // ================================================================ admin

    /// @notice Propose `newOwner`; ownership moves when it calls `acceptOwnership`.
    function transferOwnership(address newOwner) external onlyOwner {
        pendingOwner = newOwner;
        emit OwnershipTransferStarted(msg.sender, newOwner);
    }

    /// @notice Accept a proposed ownership transfer.
    function acceptOwnership() external {
        if (msg.sender != pendingOwner) revert JobEscrowNotPendingOwner(msg.sender);
        address previous = owner;
        owner = msg.sender;
        pendingOwner = address(0);
        emit OwnershipTransferred(previous, msg.sender);
    }

    /// @notice Change the operator key (the scheduler). Funds are unaffected.
    function setOperator(address newOperator) external onlyOwner {
        if (newOperator == address(0)) revert JobEscrowZeroAddress();
        emit OperatorChanged(operator, newOperator);
        operator = newOperator;
    }

    /// @notice Change where future fees are credited. Fees already credited stay with the old one.
    function setTreasury(address newTreasury) external onlyOwner {
        if (newTreasury == address(0)) revert JobEscrowZeroAddress();
        emit TreasuryChanged(treasury, newTreasury);
        treasury = newTreasury;
    }

    /// @notice Change the fee for jobs created from now on (at most MAX_FEE_BPS).
    function setFeeBps(uint16 newFeeBps) external onlyOwner {
        if (newFeeBps > MAX_FEE_BPS) revert JobEscrowFeeTooHigh(newFeeBps, MAX_FEE_BPS);
        emit FeeChanged(feeBps, newFeeBps);
        feeBps = newFeeBps;
    }

    // ================================================================ views

    /// @notice The status of a job (None if unknown).
    function statusOf(bytes32 jobId) external view returns (Status) {
        return _statusOf(jobId);
    }

    /// @notice Whether `job` is the current state of `jobId`.
    function isCurrent(bytes32 jobId, Job calldata job) external view returns (bool) {
        uint256 slot = _jobs[jobId];
        return slot != 0 && slot == _pack(_hashCalldata(job), Status(uint8(slot)));
    }

    /// @notice Withdrawable balance of `account`.
    function balanceOf(address account) external view returns (uint256) {
        return _balances[account];
    }

    /// @notice The EIP-712 domain separator of this deployment on this chain.
    function domainSeparator() public view returns (bytes32) {
        return block.chainid == _cachedChainId ? _cachedDomainSeparator : _buildDomainSeparator();
    }

    /// @notice The EIP-712 digest a provider signs to have `outputCid` relayed for `jobId`.
    function resultDigest(bytes32 jobId, uint16 attempt, string calldata outputCid)
        public
        view
        returns (bytes32)
    {
        bytes32 structHash =
            keccak256(abi.encode(RESULT_TYPEHASH, jobId, attempt, keccak256(bytes(outputCid))));
        return keccak256(abi.encodePacked("\x19\x01", domainSeparator(), structHash));
    }

    // ================================================================ internals

    /// @dev Records a result for the two-step path (release or claim follows).
    function _acceptResult(bytes32 jobId, Job calldata job, string calldata outputCid) private {
        uint40 submittedAt = _validateResult(jobId, job, outputCid);
        _jobs[jobId] = _pack(
            _hashWith(job, job.provider, submittedAt, job.attempt, keccak256(bytes(outputCid))),
            Status.Submitted
        );
        emit ResultSubmitted(jobId, job.provider, job.attempt, submittedAt, outputCid);
    }

    function _validateResult(bytes32 jobId, Job calldata job, string calldata outputCid)
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
        Job calldata job,
        string calldata outputCid,
        bytes calldata signature
    ) private view {
        address signer = _recover(resultDigest(jobId, job.attempt, outputCid), signature);
        if (signer != job.provider) revert JobEscrowBadSignature(jobId, signer, job.provider);
    }

    /// @dev Pays a job whose status the caller has just moved to Released (effects first).
    function _finishRelease(bytes32 jobId, Job calldata job) private {
        // bounty < 2**96 and feeBps <= 2000, so bounty * feeBps < 2**107: no overflow, and
        // fee <= bounty, so the subtraction cannot underflow.
        uint96 fee;
        uint96 payout;
        unchecked {
            fee = uint96((uint256(job.bounty) * job.feeBps) / 10_000);
            payout = job.bounty - fee;
        }
        _credit(job.provider, payout);
        if (fee != 0) {
            uint256 accrued = uint256(feesAccrued) + fee;
            if (accrued > type(uint96).max) {
                _credit(treasury, fee); // the accumulator is full: credit directly
            } else {
                feesAccrued = uint96(accrued);
            }
        }
        emit JobReleased(jobId, job.provider, job.submitter, payout, fee);
    }

    function _finishRefund(bytes32 jobId, Job calldata job) private {
        _jobs[jobId] = _pack(_hashCalldata(job), Status.Refunded);
        _credit(job.submitter, job.bounty);
        emit JobRefunded(jobId, job.submitter, job.bounty);
    }

    function _withdraw(address payable to) private nonReentrant {
        uint256 amount = _balances[msg.sender];
        if (amount == 0) revert JobEscrowNothingToWithdraw(msg.sender);
        _balances[msg.sender] = 0;
        emit Withdrawn(msg.sender, to, amount);
        (bool ok,) = to.call{value: amount}("");
        if (!ok) revert JobEscrowWithdrawFailed(to, amount);
    }

    function _credit(address account, uint256 amount) internal override {
        // Total credits are bounded by the ETH this contract ever received (< 2**256).
        unchecked {
            _balances[account] += amount;
        }
    }

    /// @dev Revert unless `jobId` is in `expected` status and `job` is its current state.
    function _check(bytes32 jobId, Job calldata job, Status expected) private view {
        uint256 slot = _jobs[jobId];
        Status status = Status(uint8(slot));
        if (status != expected) revert JobEscrowWrongStatus(jobId, status);
        if (slot != _pack(_hashCalldata(job), status)) revert JobEscrowJobMismatch(jobId);
    }

    /// @dev As `_check`, accepting either of two statuses; returns the one found.
    function _checkEither(bytes32 jobId, Job calldata job, Status a, Status b)
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

    /// @dev keccak256(abi.encode(job)) read straight from calldata. `Job` is a static struct of
    ///      8 words, so its calldata bytes are its ABI encoding; a non-canonical encoding (dirty
    ///      high bits) hashes differently from the stored commitment and is refused by `_check`.
    function _hashCalldata(Job calldata job) private pure returns (bytes32 h) {
        assembly ("memory-safe") {
            let p := mload(0x40)
            calldatacopy(p, job, 0x100)
            h := keccak256(p, 0x100)
        }
    }

    /// @dev keccak256(abi.encode(job)) with provider, submittedAt, attempt and resultDigest
    ///      replaced; the other fields (submitter, bounty, deadline, feeBps) never change.
    function _hashWith(
        Job calldata job,
        address provider,
        uint40 submittedAt,
        uint16 attempt,
        bytes32 digest
    ) private pure returns (bytes32 h) {
        assembly ("memory-safe") {
            let p := mload(0x40)
            calldatacopy(p, job, 0x100)
            mstore(add(p, 0x40), provider)
            mstore(add(p, 0x80), submittedAt)
            mstore(add(p, 0xc0), attempt)
            mstore(add(p, 0xe0), digest)
            h := keccak256(p, 0x100)
        }
    }

    function _buildDomainSeparator() private view returns (bytes32) {
        return keccak256(
            abi.encode(_DOMAIN_TYPEHASH, _NAME_HASH, _VERSION_HASH, block.chainid, address(this))
        );
    }

    function _recover(bytes32 digest, bytes calldata signature) private pure returns (address) {
        if (signature.length != 65) return address(0);
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        if (uint256(s) > _HALF_N || (v != 27 && v != 28)) return address(0);
        return ecrecover(digest, v, r, s);
    }
}
