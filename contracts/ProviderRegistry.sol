// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {IJobEscrow} from "./IJobEscrow.sol";

/// @title ProviderRegistry
/// @notice Providers (GPU owners) register their wallet with a metadata commitment and stake
///         collateral. Each job a provider accepts locks that job's collateral out of its stake
///         until the job is final; only a ruling of that job's mediator can take it. Unstaking
///         only ever takes free stake (stake not locked by a job), through a delay.
/// @dev Abstract: the escrow inherits it so that assignment checks and slashing cost one storage
///      read, not a cross-contract call. Stake and balances live in the same contract, which keeps
///      the solvency invariant checkable in one place (docs/contracts.md).
abstract contract ProviderRegistry is IJobEscrow {
    /// @notice Stake a provider needs to be assigned any work (anti-sybil floor).
    uint96 public immutable minStake;
    /// @notice Seconds between asking to unstake and being able to withdraw it.
    uint40 public immutable unstakeDelay;

    mapping(address provider => Provider) internal _providers;
    mapping(address provider => bytes32) internal _metadataDigests;

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
        _metadataDigests[msg.sender] = digest;
        emit ProviderRegistered(msg.sender, digest, metadataCid);
        if (msg.value > 0) _addStake(msg.sender, msg.value);
    }

    /// @notice Add the ETH sent to the caller's stake. The caller must be registered.
    function stake() external payable {
        if (!_providers[msg.sender].registered) revert ProviderRegistryNotRegistered(msg.sender);
        if (msg.value == 0) revert ProviderRegistryZeroAmount();
        _addStake(msg.sender, msg.value);
    }

    /// @notice Take `amount` of free stake out: it stops backing work at once and reaches the
    ///         caller's balance after `unstakeDelay` (`completeUnstake`). Stake locked by jobs
    ///         cannot be taken. A new request adds to a pending one and restarts the delay.
    function requestUnstake(uint96 amount) external {
        Provider storage p = _providers[msg.sender];
        if (!p.registered) revert ProviderRegistryNotRegistered(msg.sender);
        if (amount == 0) revert ProviderRegistryZeroAmount();
        uint96 free = p.stake - p.locked;
        if (amount > free) revert ProviderRegistryUnstakeTooLarge(amount, free);
        uint40 availableAt = uint40(block.timestamp) + unstakeDelay;
        p.stake -= amount;
        p.unstakePending += amount; // both < 2**96: the sum was part of `stake`
        p.unstakeAt = availableAt;
        emit UnstakeRequested(msg.sender, amount, availableAt);
    }

    /// @notice After the delay, move the pending unstake to the caller's withdrawable balance.
    function completeUnstake() external {
        Provider storage p = _providers[msg.sender];
        uint96 pending = p.unstakePending;
        if (pending == 0) revert ProviderRegistryNoUnstakePending(msg.sender);
        if (block.timestamp < p.unstakeAt) {
            revert ProviderRegistryUnstakeNotReady(p.unstakeAt, block.timestamp);
        }
        p.unstakePending = 0;
        p.unstakeAt = 0;
        emit Unstaked(msg.sender, pending, p.stake);
        _credit(msg.sender, pending);
    }

    /// @notice A provider's registry entry.
    function providerOf(address provider) external view returns (Provider memory) {
        return _providers[provider];
    }

    /// @notice keccak256 of the provider's metadata CID, as last registered.
    function metadataDigestOf(address provider) external view returns (bytes32) {
        return _metadataDigests[provider];
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

    /// @dev Lock `amount` of `provider`'s free stake for a job; reverts unless it is registered,
    ///      holds `minStake` and has that much free.
    function _lock(address provider, uint96 amount) internal {
        Provider storage p = _providers[provider];
        if (!p.registered) revert ProviderRegistryNotRegistered(provider);
        uint96 staked = p.stake;
        if (staked < minStake) {
            revert ProviderRegistryInsufficientStake(provider, staked, minStake);
        }
        uint96 locked = p.locked;
        if (staked - locked < amount) {
            revert ProviderRegistryInsufficientCollateral(provider, staked - locked, amount);
        }
        unchecked {
            p.locked = locked + amount; // <= stake < 2**96
        }
    }

    /// @dev Unlock a job's collateral (the job is final, or the provider no longer holds it).
    function _unlock(address provider, uint96 amount) internal {
        _providers[provider].locked -= amount;
    }

    /// @dev Take a job's locked collateral out of the provider's stake (a mediator's ruling).
    function _slashLocked(address provider, uint96 amount) internal {
        Provider storage p = _providers[provider];
        p.locked -= amount;
        p.stake -= amount;
    }

    function _addStake(address provider, uint256 amount) private {
        Provider storage p = _providers[provider];
        uint256 total = uint256(p.stake) + amount;
        if (total + p.unstakePending > type(uint96).max) {
            revert ProviderRegistryStakeTooHigh(total, type(uint96).max);
        }
        p.stake = uint96(total);
        emit Staked(provider, uint96(amount), uint96(total));
    }

    /// @dev Whether `account` is a key that may never be a provider (operator, treasury).
    function _isReserved(address account) internal view virtual returns (bool);

    /// @dev Credit `amount` to `account`'s withdrawable balance (implemented by the escrow).
    function _credit(address account, uint256 amount) internal virtual;
}
