// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {IJobEscrow} from "./IJobEscrow.sol";

/// @title ProviderRegistry
/// @notice Providers (GPU owners) register their wallet with a metadata commitment and may stake
///         collateral. Stake leaves only through a delayed unstake, and is slashed only by the
///         escrow's rules (a rejected result), never by an admin.
/// @dev Abstract: the escrow inherits it so that assignment checks and slashing cost one storage
///      read, not a cross-contract call. Stake and balances live in the same contract, which keeps
///      the solvency invariant (ETH held == escrowed + balances + stakes) checkable in one place.
abstract contract ProviderRegistry is IJobEscrow {
    /// @notice Stake a provider needs to be assigned work (0: staking optional).
    uint96 public immutable minStake;
    /// @notice Seconds between asking to unstake and being able to withdraw it.
    uint40 public immutable unstakeDelay;
    /// @notice Share of a provider's stake slashed per rejected result, in basis points.
    uint16 public immutable slashBps;

    mapping(address provider => Provider) internal _providers;
    mapping(address provider => bytes32) internal _metadataDigests;

    constructor(uint96 minStake_, uint40 unstakeDelay_, uint16 slashBps_) {
        if (slashBps_ > 10_000) revert JobEscrowFeeTooHigh(slashBps_, 10_000);
        minStake = minStake_;
        unstakeDelay = unstakeDelay_;
        slashBps = slashBps_;
    }

    /// @notice Register the caller as a provider, or update its metadata; any ETH sent is staked.
    /// @param metadataCid IPFS CID of the provider's signed metadata (GPU specs, region, price).
    function registerProvider(string calldata metadataCid) external payable {
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

    /// @notice Start taking `amount` of stake out; it stays slashable until `completeUnstake`.
    /// @dev A new request replaces a pending one and restarts the delay.
    function requestUnstake(uint96 amount) external {
        Provider storage p = _providers[msg.sender];
        if (!p.registered) revert ProviderRegistryNotRegistered(msg.sender);
        if (amount == 0) revert ProviderRegistryZeroAmount();
        if (amount > p.stake) revert ProviderRegistryUnstakeTooLarge(amount, p.stake);
        uint40 availableAt = uint40(block.timestamp) + unstakeDelay;
        p.unstakePending = amount;
        p.unstakeAt = availableAt;
        emit UnstakeRequested(msg.sender, amount, availableAt);
    }

    /// @notice After the delay, move the pending stake to the caller's withdrawable balance.
    /// @dev If the stake was slashed meanwhile, only what is left is released.
    function completeUnstake() external {
        Provider storage p = _providers[msg.sender];
        uint96 pending = p.unstakePending;
        if (pending == 0) revert ProviderRegistryNoUnstakePending(msg.sender);
        if (block.timestamp < p.unstakeAt) {
            revert ProviderRegistryUnstakeNotReady(p.unstakeAt, block.timestamp);
        }
        uint96 amount = pending < p.stake ? pending : p.stake;
        p.stake -= amount;
        p.unstakePending = 0;
        p.unstakeAt = 0;
        emit Unstaked(msg.sender, amount, p.stake);
        _credit(msg.sender, amount);
    }

    /// @notice A provider's registry entry.
    function providerOf(address provider) external view returns (Provider memory) {
        return _providers[provider];
    }

    /// @notice keccak256 of the provider's metadata CID, as last registered.
    function metadataDigestOf(address provider) external view returns (bytes32) {
        return _metadataDigests[provider];
    }

    /// @notice Whether the escrow may assign work to `provider` right now.
    function isEligible(address provider) public view returns (bool) {
        Provider storage p = _providers[provider];
        return p.registered && p.stake - p.unstakePending >= minStake;
    }

    /// @dev Reverts unless `provider` is registered with enough stake not on its way out.
    function _requireEligible(address provider) internal view {
        Provider storage p = _providers[provider];
        if (!p.registered) revert ProviderRegistryNotRegistered(provider);
        uint96 effective = p.stake - p.unstakePending;
        if (effective < minStake) {
            revert ProviderRegistryInsufficientStake(provider, effective, minStake);
        }
    }

    /// @dev Slash `slashBps` of the provider's stake into `beneficiary`'s balance.
    function _slash(address provider, bytes32 jobId, address beneficiary)
        internal
        returns (uint96 amount)
    {
        Provider storage p = _providers[provider];
        // stake < 2**96 and slashBps <= 10_000, so the product fits easily in uint256.
        amount = uint96((uint256(p.stake) * slashBps) / 10_000);
        if (amount == 0) return 0;
        p.stake -= amount;
        if (p.unstakePending > p.stake) p.unstakePending = p.stake;
        emit ProviderSlashed(provider, jobId, amount, beneficiary);
        _credit(beneficiary, amount);
    }

    function _addStake(address provider, uint256 amount) private {
        Provider storage p = _providers[provider];
        uint256 total = uint256(p.stake) + amount;
        if (total > type(uint96).max) revert ProviderRegistryStakeTooHigh(total, type(uint96).max);
        p.stake = uint96(total);
        emit Staked(provider, uint96(amount), uint96(total));
    }

    /// @dev Credit `amount` to `account`'s withdrawable balance (implemented by the escrow).
    function _credit(address account, uint256 amount) internal virtual;
}
