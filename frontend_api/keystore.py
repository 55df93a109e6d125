"""The submitter's wallet key: :mod:`gridmarket.keystore`, shared with the provider agent."""

from gridmarket.keystore import KeystoreError, create_keystore, keystore_address, load_account

__all__ = ["KeystoreError", "create_keystore", "keystore_address", "load_account"]
