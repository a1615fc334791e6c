"""What the proxy does with a statement before and after the engine answers it.

`routing` decides where each statement goes (DP, a ``dp.*`` setting, pass-through, refusal);
`settings` keeps the session's ``dp.*`` settings; `parameters` binds ``$n`` values into a DP
query; `answering` answers a translated query (the engine decides, the reader measures, the
ledger store records); `memo` remembers routes, translations and answers from history;
`results` turns DP answers into protocol messages.
"""
