"""The shipped MessageTransformer plugins, named ``bridgemgr.transformers.<module>.<Class>``.

uppercase.UppercaseTransformer, headers.HeaderMapping, routing.ContentRouter,
charset.TextToBytes and charset.BytesToText (docs/jms-bridges.md#transformers).
Their old names ``transformers.<module>.<Class>`` still load them (bridgemgr.transform).
Your own plugins go in a plugin folder, not here (docs/transformers.md).
"""
