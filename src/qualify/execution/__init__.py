"""The path of a case from its Ray task to its stored result.

`ray` single-node Ray tasks (and starting/joining Ray); `multinode` one launch over N nodes; `launches`
a case as N process launches merged into one document (and the paired A/B runner); `paired` the previous
release's side of a paired case, found on the driver; `attempts` the retry loop, spooling and committing a
result; `spool` results on disk before the database; `node_facts` what is read on a node's host side;
`result` the one result type and a case's per-node resource share. Only this package imports Ray.
"""
