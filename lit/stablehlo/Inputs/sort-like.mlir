func.func @main(%arg0: tensor<2x3xf32>, %arg1: tensor<i32>) -> (tensor<3x5xf32>, tensor<2x2xf32>, tensor<2xi32>) {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %0 = stablehlo.pad %arg0, %cst, low = [0, 0], high = [0, 0], interior = [1, 1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<3x5xf32>
  %c = stablehlo.constant dense<0> : tensor<i32>
  %1 = stablehlo.dynamic_slice %arg0, %c, %arg1, sizes = [2, 2] : (tensor<2x3xf32>, tensor<i32>, tensor<i32>) -> tensor<2x2xf32>
  %2 = stablehlo.iota dim = 1 : tensor<2x3xi32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %3:2 = stablehlo.reduce(%arg0 init: %ninf), (%2 init: %c) across dimensions = [1] : (tensor<2x3xf32>, tensor<2x3xi32>, tensor<f32>, tensor<i32>) -> (tensor<2xf32>, tensor<2xi32>)
   reducer(%a1: tensor<f32>, %a3: tensor<f32>) (%a2: tensor<i32>, %a4: tensor<i32>)  {
    %4 = stablehlo.compare NE, %a1, %a3, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %5 = stablehlo.compare EQ, %a1, %a3, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %6 = stablehlo.compare LT, %a2, %a4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %7 = stablehlo.and %5, %6 : tensor<i1>
    %8 = stablehlo.or %4, %7 : tensor<i1>
    %9 = stablehlo.select %4, %a1, %a3 : tensor<i1>, tensor<f32>
    %10 = stablehlo.select %8, %a2, %a4 : tensor<i1>, tensor<i32>
    stablehlo.return %9, %10 : tensor<f32>, tensor<i32>
  }
  return %0, %1, %3#1 : tensor<3x5xf32>, tensor<2x2xf32>, tensor<2xi32>
}
