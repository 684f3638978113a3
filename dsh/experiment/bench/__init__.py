"""``python -m dsh bench``: dsh's paths against the libraries' defaults (:mod:`.compare`) and the laptop paths against
the roofline measured in the same run (:mod:`.tiny`)."""
