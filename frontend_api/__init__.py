"""GridMarket's front end: pages and a JSON API for people (submitters, providers, onlookers).

It holds no business logic of its own. Everything shown comes from the scheduler's API
(:mod:`frontend_api.scheduler`), the escrow's events folded with
:func:`gridmarket.escrow.apply_event` (:mod:`frontend_api.index`) and IPFS. Every transaction is
built unsigned for the visitor's own wallet (:mod:`frontend_api.txs`): the front end never holds
a key. The submitter CLI (:mod:`frontend_api.submitter_cli`) is a client of the same JSON API.
"""

__version__ = "0.1.0"
