func.func @main(%arg0: tensor<3x2xf32>, %arg1: tensor<2xf32>, %arg2: tensor<4x3xf32>) -> tensor<4x2xf32> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %0 = stablehlo.dot_general %arg2, %arg0, contracting_dims = [1] x [0] : (tensor<4x3xf32>, tensor<3x2xf32>) -> tensor<4x2xf32>
  %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.add across dimensions = [0] : (tensor<4x2xf32>, tensor<f32>) -> tensor<2xf32>
  %2 = stablehlo.add %1, %arg1 : tensor<2xf32>
  %3 = stablehlo.broadcast_in_dim %2, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %4 = stablehlo.subtract %0, %3 : tensor<4x2xf32>
  return %4 : tensor<4x2xf32>
}
