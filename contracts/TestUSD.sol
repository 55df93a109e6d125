// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// @title TestUSD
/// @notice A USDC-like ERC-20 for the devnet and tests: 6 decimals and EIP-2612 `permit`, so a
///         submitter funds a job in one transaction (`permitToken` + `createJobWith` in one
///         `multicall` of the escrow). The deployer may mint (the devnet's faucet); it is not
///         meant for a public chain, where the real stablecoin is listed instead.
contract TestUSD {
    string public constant name = "Test USD";
    string public constant symbol = "tUSD";
    uint8 public constant decimals = 6;
    bytes32 public constant PERMIT_TYPEHASH = keccak256(
        "Permit(address owner,address spender,uint256 value,uint256 nonce,uint256 deadline)"
    );
    bytes32 private constant _DOMAIN_TYPEHASH = keccak256(
        "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
    );

    address public immutable minter;
    uint256 public totalSupply;
    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;
    mapping(address => uint256) public nonces;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);

    error TestUSDNotMinter(address caller);
    error TestUSDInsufficientBalance(address account, uint256 balance, uint256 needed);
    error TestUSDInsufficientAllowance(address spender, uint256 allowance, uint256 needed);
    error TestUSDPermitExpired(uint256 deadline, uint256 nowTs);
    error TestUSDBadPermit(address signer, address owner);
    error TestUSDZeroAddress();

    constructor() {
        minter = msg.sender;
    }

    /// @notice Create `value` tokens for `to` (the deployer only: the devnet faucet).
    function mint(address to, uint256 value) external {
        if (msg.sender != minter) revert TestUSDNotMinter(msg.sender);
        if (to == address(0)) revert TestUSDZeroAddress();
        totalSupply += value;
        unchecked {
            balanceOf[to] += value; // <= totalSupply
        }
        emit Transfer(address(0), to, value);
    }

    function transfer(address to, uint256 value) external returns (bool) {
        _move(msg.sender, to, value);
        return true;
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        uint256 allowed = allowance[from][msg.sender];
        if (allowed != type(uint256).max) {
            if (allowed < value) revert TestUSDInsufficientAllowance(msg.sender, allowed, value);
            unchecked {
                allowance[from][msg.sender] = allowed - value;
            }
        }
        _move(from, to, value);
        return true;
    }

    function approve(address spender, uint256 value) external returns (bool) {
        allowance[msg.sender][spender] = value;
        emit Approval(msg.sender, spender, value);
        return true;
    }

    /// @notice EIP-2612: approve by the owner's signature.
    function permit(
        address owner,
        address spender,
        uint256 value,
        uint256 deadline,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) external {
        if (block.timestamp > deadline) revert TestUSDPermitExpired(deadline, block.timestamp);
        bytes32 structHash = keccak256(
            abi.encode(PERMIT_TYPEHASH, owner, spender, value, nonces[owner]++, deadline)
        );
        bytes32 digest = keccak256(abi.encodePacked("\x19\x01", DOMAIN_SEPARATOR(), structHash));
        address signer = ecrecover(digest, v, r, s);
        if (signer == address(0) || signer != owner) revert TestUSDBadPermit(signer, owner);
        allowance[owner][spender] = value;
        emit Approval(owner, spender, value);
    }

    /// @notice The EIP-712 domain of permits (name "Test USD", version "1").
    function DOMAIN_SEPARATOR() public view returns (bytes32) {
        return keccak256(
            abi.encode(_DOMAIN_TYPEHASH, keccak256(bytes(name)), keccak256("1"), block.chainid, address(this))
        );
    }

    function _move(address from, address to, uint256 value) private {
        if (to == address(0)) revert TestUSDZeroAddress();
        uint256 balance = balanceOf[from];
        if (balance < value) revert TestUSDInsufficientBalance(from, balance, value);
        unchecked {
            balanceOf[from] = balance - value;
            balanceOf[to] += value; // the sum of balances is totalSupply
        }
        emit Transfer(from, to, value);
    }
}
