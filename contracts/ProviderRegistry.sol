// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {IJobEscrow} from "./IJobEscrow.sol";

/// @dev The part of ERC-20 (and EIP-2612) the escrow calls.
interface IERC20Min {
    function balanceOf(address account) external view returns (uint256);
    function transfer(address to, uint256 amount) external returns (bool);
    function transferFrom(address from, address to, uint256 amount) external returns (bool);
    function allowance(address owner, address spender) external view returns (uint256);
    function permit(
        address owner,
        address spender,
        uint256 value,
        uint256 deadline,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) external;
}

/// @title ProviderRegistry
/// @notice Providers (GPU owners) register their wallet with a metadata commitment and stake
///         collateral. Each job a provider accepts locks that job's collateral out of its stake
///         until the job is final; only a ruling of that job's mediator can take it. Unstaking
///         only ever takes free stake (stake not locked by a job), through a delay. Stake is
///         held per token: a job funded in a token locks its collateral from the provider's
///         stake in that token; the ETH stake (at least `minStake`) is the anti-sybil floor every
///         provider needs for any work.
/// @dev Abstract: the escrow inherits it so that assignment checks and slashing cost one storage
///      read, not a cross-contract call. Stake and balances live in the same contract, which keeps
///      the solvency invariant checkable in one place (docs/contracts.md).
abstract contract ProviderRegistry is IJobEscrow {
    /// @notice Stake a provider needs to be assigned any work (anti-sybil floor).
    uint96 public immutable minStake;
    /// @notice Seconds between asking to unstake and being able to withdraw it.
    uint40 public immutable unstakeDelay;

    mapping(address provider => Provider) internal _providers;
    mapping(address provider => mapping(address token => Provider)) internal _tokenStakes;
    /// @notice The smallest bounty (per seat) of a job funded in an ERC-20 token, in its units;
    ///         zero for a token new jobs and stakes may not use (the owner's list, `setToken`;
    ///         ETH is always allowed, with `minBounty`).
    mapping(address token => uint256) public tokenMinBounty;

    constructor(uint96 minStake_, uint40 unstakeDelay_) {
        minStake = minStake_;
        unstakeDelay = unstakeDelay_;
    }

    /// @notice Register the caller as a provider, or update its metadata; any ETH sent is staked.
    ///         The operator and the treasury can never be providers.
    /// @param metadataCid IPFS CID of the provider's signed metadata (GPU specs, region, price).
    function registerProvider(string calldata metadataCid) external payable {
        if (_isReserved(msg.sender)) revert ProviderRegistryReservedAddress(msg.sender);
        uint256 len = bytes(metadataCid).length;
        if (len == 0 || len > 128) revert ProviderRegistryBadMetadataCid(len);
        bytes32 digest = keccak256(bytes(metadataCid));
        _providers[msg.sender].registered = true;
        emit ProviderRegistered(msg.sender, digest, metadataCid);
        if (msg.value > 0) _addStake(msg.sender, address(0), msg.value);
    }

    /// @notice Add the ETH sent to the caller's stake. The caller must be registered.
    function stake() external payable {
        _requireRegistered(msg.sender);
        if (msg.value == 0) revert ProviderRegistryZeroAmount();
        _addStake(msg.sender, address(0), msg.value);
    }

    /// @notice Add `amount` of an allow-listed `token` to the caller's stake in it (the collateral
    ///         of jobs funded in that token), pulled with `transferFrom`: approve it first, or
    ///         call `permitToken` before it in one `multicall`. The caller must be registered.
    function stakeToken(address token, uint96 amount) external {
        _requireRegistered(msg.sender);
        if (tokenMinBounty[token] == 0) revert JobEscrowTokenNotAllowed(token);
        if (amount == 0) revert ProviderRegistryZeroAmount();
        _addStake(msg.sender, token, amount);
        _pull(token, amount);
    }

    /// @notice Take `amount` of free ETH stake out: it stops backing work at once and reaches
    ///         the caller's balance after `unstakeDelay` (`completeUnstake`). Stake locked by
    ///         jobs cannot be taken. A new request adds to a pending one and restarts the delay.
    function requestUnstake(uint96 amount) external {
        _requestUnstake(address(0), amount);
    }

    /// @notice `requestUnstake` for the caller's stake in `token`.
    function requestUnstakeToken(address token, uint96 amount) external {
        _requestUnstake(token, amount);
    }

    /// @notice After the delay, move the pending ETH unstake to the caller's withdrawable
    ///         balance.
    function completeUnstake() external {
        _completeUnstake(address(0));
    }

    /// @notice `completeUnstake` for the caller's stake in `token`.
    function completeUnstakeToken(address token) external {
        _completeUnstake(token);
    }

    /// @notice A provider's registry entry (its ETH stake).
    function providerOf(address provider) external view returns (Provider memory) {
        return _providers[provider];
    }

    /// @notice A provider's stake in `token` (zero: ETH, as `providerOf`).
    function stakeOf(address provider, address token) external view returns (Provider memory) {
        return _stakeOf(provider, token);
    }

    /// @notice Stake in `token` not locked by any job: the most collateral a new job funded in
    ///         `token` may lock.
    function freeCollateralIn(address provider, address token) external view returns (uint256) {
        Provider storage p = _stakeOf(provider, token);
        return p.stake - p.locked;
    }

    /// @notice Whether `provider` is registered with at least `minStake` (it may still lack the
    ///         free collateral a particular job needs: `freeCollateralOf`).
    function isEligible(address provider) public view returns (bool) {
        Provider storage p = _providers[provider];
        return p.registered && p.stake >= minStake;
    }

    /// @notice Stake not locked by any job: the most collateral a new job may lock.
    function freeCollateralOf(address provider) external view returns (uint256) {
        Provider storage p = _providers[provider];
        return p.stake - p.locked;
    }

    /// @dev Lock `amount` of `provider`'s free stake in `token` for a job; reverts unless it is
    ///      registered, holds `minStake` of ETH and has that much free in `token`.
    function _lock(address provider, address token, uint96 amount) internal {
        Provider storage e = _providers[provider];
        if (!e.registered) revert ProviderRegistryNotRegistered(provider);
        uint96 staked = e.stake;
        if (staked < minStake) {
            revert ProviderRegistryInsufficientStake(provider, staked, minStake);
        }
        Provider storage p = token == address(0) ? e : _tokenStakes[provider][token];
        staked = p.stake;
        uint96 locked = p.locked;
        if (staked - locked < amount) {
            revert ProviderRegistryInsufficientCollateral(provider, staked - locked, amount);
        }
        unchecked {
            p.locked = locked + amount; // <= stake < 2**96
        }
    }

    /// @dev Unlock a job's collateral (the job is final, or the provider no longer holds it).
    function _unlock(address provider, address token, uint96 amount) internal {
        _stakeOf(provider, token).locked -= amount;
    }

    /// @dev Take a job's locked collateral out of the provider's stake (a ruling or `resolve`).
    function _slashLocked(address provider, address token, uint96 amount) internal {
        Provider storage p = _stakeOf(provider, token);
        p.locked -= amount;
        p.stake -= amount;
    }

    function _stakeOf(address provider, address token) internal view returns (Provider storage) {
        return token == address(0) ? _providers[provider] : _tokenStakes[provider][token];
    }

    function _requireRegistered(address provider) private view {
        if (!_providers[provider].registered) revert ProviderRegistryNotRegistered(provider);
    }

    function _requestUnstake(address token, uint96 amount) private {
        _requireRegistered(msg.sender);
        Provider storage p = _stakeOf(msg.sender, token);
        if (amount == 0) revert ProviderRegistryZeroAmount();
        uint96 free = p.stake - p.locked;
        if (amount > free) revert ProviderRegistryUnstakeTooLarge(amount, free);
        uint40 availableAt = uint40(block.timestamp) + unstakeDelay;
        p.stake -= amount;
        p.unstakePending += amount; // both < 2**96: the sum was part of `stake`
        p.unstakeAt = availableAt;
        emit UnstakeRequested(msg.sender, token, amount, availableAt);
    }

    function _completeUnstake(address token) private {
        Provider storage p = _stakeOf(msg.sender, token);
        uint96 pending = p.unstakePending;
        if (pending == 0) revert ProviderRegistryNoUnstakePending(msg.sender);
        if (block.timestamp < p.unstakeAt) {
            revert ProviderRegistryUnstakeNotReady(p.unstakeAt, block.timestamp);
        }
        p.unstakePending = 0;
        p.unstakeAt = 0;
        emit Unstaked(msg.sender, token, pending, p.stake);
        _credit(msg.sender, token, pending);
    }

    function _addStake(address provider, address token, uint256 amount) private {
        Provider storage p = _stakeOf(provider, token);
        uint256 total = uint256(p.stake) + amount;
        if (total + p.unstakePending > type(uint96).max) {
            revert ProviderRegistryStakeTooHigh(total, type(uint96).max);
        }
        p.stake = uint96(total);
        emit Staked(provider, token, uint96(amount), uint96(total));
    }

    /// @dev Pull exactly `amount` of `token` from the caller; a token that delivers any other
    ///      amount (a fee on transfer) is refused. Called after the state changes it pays for.
    function _pull(address token, uint256 amount) internal {
        uint256 before = IERC20Min(token).balanceOf(address(this));
        _callToken(token, abi.encodeCall(IERC20Min.transferFrom, (msg.sender, address(this), amount)));
        uint256 received = IERC20Min(token).balanceOf(address(this)) - before;
        if (received != amount) revert JobEscrowTokenAmountMismatch(token, amount, received);
    }

    /// @dev Call a token, accepting both a `true` return and no return data (tokens that return
    ///      nothing, such as USDT), and refusing an address without code.
    function _callToken(address token, bytes memory data) internal {
        (bool ok, bytes memory ret) = token.call(data);
        if (!ok || (ret.length == 0 ? token.code.length == 0 : !abi.decode(ret, (bool)))) {
            revert JobEscrowTokenTransferFailed(token);
        }
    }

    /// @dev Whether `account` is a key that may never be a provider (operator, treasury).
    function _isReserved(address account) internal view virtual returns (bool);

    /// @dev Credit `amount` of `token` (zero: ETH) to `account`'s withdrawable balance
    ///      (implemented by the escrow).
    function _credit(address account, address token, uint256 amount) internal virtual;
}
