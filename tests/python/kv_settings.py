"""What kv_program.py runs, which test_kv_vs_mxnet.py's references recompute: the keys' shapes,
the steps, and each optimizer's settings by MXNet's names."""
SHAPES = [(7,), (3, 5), (11,)]
STEPS = 5
PARAMS = {"sgd": dict(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5),
          "adam": dict(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8, wd=0.0,
                       rescale_grad=0.5)}
