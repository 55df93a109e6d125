"""GridMarket's front end: pages and a JSON API for people (submitters, providers, onlookers).

It holds no business logic of its own. Everything shown comes from the scheduler's API
(:mod:`frontend_api.scheduler`), the escrow's events folded with
:func:`gridmarket.escrow.apply_event` (:mod:`frontend_api.index`) and IPFS. Every transaction is
built unsigned for the visitor's own wallet (:mod:`frontend_api.txs`): the front end never holds
a key. The submitter CLI (:mod:`frontend_api.submitter_cli`) is a client of the same JSON API
(its plumbing in :mod:`frontend_api.submitter_client`, its uploads and downloads in
:mod:`frontend_api.submitter_files`).

- :mod:`frontend_api.app` builds the app (``python -m frontend_api`` serves it);
  :mod:`frontend_api.settings` its ``GRIDMARKET_FRONTEND_*`` settings.
- :mod:`frontend_api.pages` (HTML, :mod:`frontend_api.web`, ``templates/``, ``static/``) and
  :mod:`frontend_api.api` (JSON under ``/api``) parse, call and serialise.
- :mod:`frontend_api.backend` holds the clients: :mod:`frontend_api.scheduler` (the scheduler's
  API), :mod:`frontend_api.index` (chain events, answered as the records of
  :mod:`frontend_api.records`), :mod:`frontend_api.txs` (unsigned transactions), IPFS.
- :mod:`frontend_api.forms`, :mod:`frontend_api.jobfile` and :mod:`frontend_api.values` check
  what people send, naming the bad field; :mod:`frontend_api.format` and :mod:`frontend_api.svg`
  present amounts, times and charts.
"""

__version__ = "0.1.0"
