// gpt_tf's fused CPU kernels (see gpt_tf/speed/kernels/__init__.py): one pass over memory where TensorFlow's
// graph makes several. One library, one translation unit (TensorFlow's headers are parsed once), a
// header per kernel. Built by gpt_tf/speed/kernels/build.py against the installed TensorFlow.
#include "adamw.h"
#include "dropout.h"
#include "gelu.h"
#include "layer_norm.h"
#include "weight_matmul.h"
