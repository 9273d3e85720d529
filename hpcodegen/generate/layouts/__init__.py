"""From styles to boundary entries: Megatron's layouts, the Lifter and its entries, the
MoE experts, tied and unplanned parameters, and the axes added on top (``--cp``,
``--pp``, ``--sp``'s token dims); ``cost`` prices a kept plan.
"""
